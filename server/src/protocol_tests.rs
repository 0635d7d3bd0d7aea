//! Request bodies read into generations, and every kind of bad body refused naming its field.

use super::*;

const EOS: [u32; 1] = [7];

fn context() -> Context<'static> {
    Context {
        model: "tiny",
        tokenizer: None,
        eos: &EOS,
        max_seq: 64,
        seed: 11,
    }
}

fn read(endpoint: Endpoint, body: &str) -> Result<Generation, ApiError> {
    parse(endpoint, body.as_bytes(), &context())
}

fn refused(endpoint: Endpoint, body: &str) -> ApiError {
    match read(endpoint, body) {
        Err(error) => error,
        Ok(generation) => panic!("{body} was taken: {generation:?}"),
    }
}

#[test]
fn a_completion_of_token_ids_takes_the_openai_defaults() {
    let generation = read(
        Endpoint::Completions,
        r#"{"model": "tiny", "prompt": [1, 2, 3]}"#,
    )
    .unwrap();
    let request = &generation.request;
    assert_eq!(request.prompt, [1, 2, 3]);
    assert_eq!(request.stop.max_new_tokens, DEFAULT_COMPLETION_TOKENS);
    assert_eq!(request.stop.eos_token_ids, EOS);
    assert_eq!(
        request.sampling,
        SamplingParams {
            seed: 11,
            ..SamplingParams::default()
        }
    );
    assert!(!generation.stream && !generation.include_usage && !generation.return_token_ids);
}

#[test]
fn every_sampling_field_reaches_the_request() {
    let body = r#"{"prompt": [[4, 5]], "max_tokens": 9, "temperature": 0.5, "top_p": 0.9,
        "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "seed": -1, "ignore_eos": true,
        "stream": true, "stream_options": {"include_usage": true}, "return_token_ids": true,
        "n": 1, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "user": "u",
        "echo": false, "logprobs": null, "best_of": 1}"#;
    let generation = read(Endpoint::Completions, body).unwrap();
    let request = &generation.request;
    assert_eq!(request.prompt, [4, 5]);
    assert_eq!(request.stop.max_new_tokens, 9);
    assert!(request.stop.eos_token_ids.is_empty());
    let want = SamplingParams {
        temperature: 0.5,
        top_k: 40,
        top_p: 0.9,
        min_p: 0.05,
        repetition_penalty: 1.1,
        seed: u64::MAX,
    };
    assert_eq!(request.sampling, want);
    assert!(generation.stream && generation.include_usage && generation.return_token_ids);
    // top_k -1 is vLLM's "all tokens".
    let all = read(Endpoint::Completions, r#"{"prompt": [1], "top_k": -1}"#).unwrap();
    assert_eq!(all.request.sampling.top_k, 0);
}

#[test]
fn bad_bodies_are_refused_naming_the_field() {
    let many = format!(r#"{{"prompt": [1], "stop": {:?}}}"#, vec!["x"; 17]);
    let long = format!(r#"{{"prompt": [1], "stop": "{}"}}"#, "x".repeat(257));
    let cases: [(Endpoint, &str, Option<&str>, &str); 21] = [
        (
            Endpoint::Completions,
            &many,
            Some("stop"),
            "17 stop strings: at most 16",
        ),
        (
            Endpoint::Completions,
            &long,
            Some("stop"),
            "257 bytes: at most 256",
        ),
        (Endpoint::Completions, "{", None, "EOF"),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "bogus": 1}"#,
            None,
            "unknown field `bogus`",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "temperature": "hot"}"#,
            None,
            "invalid type",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "temperature": -1}"#,
            Some("temperature"),
            "temperature",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "top_p": 0}"#,
            Some("top_p"),
            "top_p",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "top_k": -2}"#,
            Some("top_k"),
            "-2",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "max_tokens": 0}"#,
            Some("max_tokens"),
            "at least 1",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "n": 2}"#,
            Some("n"),
            "only 1",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "echo": true}"#,
            Some("echo"),
            "only false",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "presence_penalty": 0.5}"#,
            Some("presence_penalty"),
            "only 0",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1, -3]}"#,
            Some("prompt"),
            "prompt token 1 is -3",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [[1], [2]]}"#,
            Some("prompt"),
            "one prompt per request",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": {"a": 1}}"#,
            Some("prompt"),
            "string or an array",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": "hello"}"#,
            Some("prompt"),
            "has none",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "stop": "x"}"#,
            Some("stop"),
            "tokenizer",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "stop": [1]}"#,
            Some("stop"),
            "array of strings",
        ),
        (
            Endpoint::Completions,
            r#"{"prompt": [1], "stream_options": {"x": 1}}"#,
            None,
            "unknown field `x`",
        ),
        (
            Endpoint::Chat,
            r#"{"messages": [{"role": "user", "content": "hi"}]}"#,
            Some("messages"),
            "no tokenizer",
        ),
        (
            Endpoint::Chat,
            r#"{"messages": [{"role": "user", "content": "hi", "colour": 1}]}"#,
            None,
            "unknown field `colour`",
        ),
    ];
    for (endpoint, body, param, message) in cases {
        let error = refused(endpoint, body);
        assert_eq!(error.status, axum::http::StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error.kind, "invalid_request_error", "{body}");
        assert_eq!(error.param, param, "{body}: {}", error.message);
        assert!(error.message.contains(message), "{body}: {}", error.message);
    }
}

#[test]
fn another_models_name_is_not_found() {
    let error = refused(
        Endpoint::Completions,
        r#"{"model": "gpt-4", "prompt": [1]}"#,
    );
    assert_eq!(error.status, axum::http::StatusCode::NOT_FOUND);
    assert_eq!(error.code, Some("model_not_found"));
    assert!(error.message.contains("`gpt-4`") && error.message.contains("`tiny`"));
    let body = error.body();
    assert_eq!(body["error"]["type"], "not_found_error");
}

#[test]
fn null_flags_are_false_and_the_model_is_checked_before_the_prompt() {
    let body = r#"{"prompt": [1], "stream": null, "echo": null, "ignore_eos": null,
        "return_token_ids": null, "stream_options": {"include_usage": null}}"#;
    let generation = read(Endpoint::Completions, body).unwrap();
    assert!(!generation.stream && !generation.include_usage && !generation.return_token_ids);
    assert_eq!(generation.request.stop.eos_token_ids, EOS);
    // Another model's name wins over a prompt this server could not read anyway.
    let error = refused(
        Endpoint::Completions,
        r#"{"model": "other", "prompt": "text"}"#,
    );
    assert_eq!(error.code, Some("model_not_found"));
}
