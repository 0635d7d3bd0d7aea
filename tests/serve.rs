//! `kiln serve` over real HTTP: the server is started on 127.0.0.1 with an ephemeral port and
//! called with `reqwest`. Completions, whole and streamed, give the greedy tokens of `kiln
//! generate`; 64 concurrent streams with 16 clients leaving mid-stream leave the others their
//! exact tokens and no slot behind; a full queue answers 503 with Retry-After; bad requests
//! get OpenAI error bodies; SIGTERM drains and exits 0. On a model with a tokenizer, chat and
//! text completions give `kiln generate`'s text, streamed as whole, stop strings cut alike; the
//! official `openai` Python client talks to it (`tests/python/openai_client.py`; skipped with
//! a printed reason where the package is missing, failed instead with `KILN_REQUIRE_OPENAI=1`,
//! as CI sets).

#[path = "support/tokenized_model.rs"]
mod tokenized_model;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};

/// A running `kiln serve`, killed when dropped.
struct Server {
    child: Child,
    base: String,
}

impl Server {
    /// Starts `kiln serve --model tiny --port 0` with `args` and waits until it listens.
    fn start(args: &[&str]) -> Server {
        Server::serving("tiny", args)
    }

    /// Starts `kiln serve --model MODEL --port 0` with `args` and waits until it listens.
    fn serving(model: &str, args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["serve", "--model", model, "--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start kiln serve");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let address = (line.split("listening on ").nth(1))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("kiln serve printed {line:?}"));
        Server {
            child,
            base: address.to_string(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn post(&self, path: &str, body: &Value) -> Response {
        client().post(self.url(path)).json(body).send().unwrap()
    }

    /// The text of `/metrics`.
    fn metrics_text(&self) -> String {
        client()
            .get(self.url("/metrics"))
            .send()
            .unwrap()
            .text()
            .unwrap()
    }

    /// `/metrics` value of `name` (a gauge or counter without labels).
    fn metric(&self, name: &str) -> f64 {
        let text = self.metrics_text();
        (text.lines())
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
    }

    /// Waits until no request runs or waits; panics after 30 s.
    fn wait_idle(&self) {
        let start = Instant::now();
        while self.metric("kiln_requests_running") + self.metric("kiln_requests_waiting") > 0.0 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "requests stay in flight"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// Greedy ids of `kiln generate` for each prompt (the serial reference scheduler).
fn generate_greedy(prompts: &[Vec<u32>], new_tokens: usize) -> Vec<Vec<u32>> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompts.jsonl");
    let lines: Vec<String> = (prompts.iter())
        .map(|p| json!({ "prompt_ids": p }).to_string())
        .collect();
    std::fs::write(&file, lines.join("\n")).unwrap();
    let out = dir.path().join("out.json");
    let status = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["generate", "--model", "tiny", "--temperature", "0"])
        .args(["--max-new-tokens", &new_tokens.to_string()])
        .arg("--prompts")
        .arg(&file)
        .arg("--json")
        .arg(&out)
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let report: Value = serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    (report["requests"].as_array().unwrap().iter())
        .map(|r| ids(&r["tokens"]))
        .collect()
}

fn ids(value: &Value) -> Vec<u32> {
    (value.as_array().unwrap().iter())
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// The data lines of a server-sent event stream, read as they come; `stop_after` chunks and
/// the reader is dropped (the client leaves).
fn sse(response: Response, stop_after: Option<usize>) -> Vec<String> {
    assert_eq!(response.status(), 200);
    let mut events = Vec::new();
    for line in BufReader::new(response).lines() {
        let line = line.unwrap();
        if let Some(data) = line.strip_prefix("data: ") {
            events.push(data.to_string());
            if stop_after == Some(events.len()) || data == "[DONE]" {
                break;
            }
        }
    }
    events
}

/// The token ids and last finish reason of a completion stream's chunks.
fn streamed(events: &[String]) -> (Vec<u32>, Option<String>) {
    let (mut tokens, mut finish) = (Vec::new(), None);
    for data in events.iter().filter(|d| *d != "[DONE]") {
        let chunk: Value = serde_json::from_str(data).unwrap();
        // An error event (the stream's end) carries no choices.
        for choice in chunk["choices"].as_array().into_iter().flatten() {
            tokens.extend(ids(&choice["token_ids"]));
            if let Some(reason) = choice["finish_reason"].as_str() {
                finish = Some(reason.to_string());
            }
        }
    }
    (tokens, finish)
}

fn completion(prompt: &[u32], max_tokens: usize, stream: bool) -> Value {
    json!({
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
        "return_token_ids": true,
    })
}

#[test]
fn completions_give_kiln_generates_tokens_whole_and_streamed() {
    let server = Server::start(&["--slots", "4"]);
    let prompts = [vec![5, 17, 42, 8], vec![3; 11], vec![90]];
    let want = generate_greedy(&prompts, 9);
    for (prompt, want) in prompts.iter().zip(&want) {
        let body: Value = server
            .post("/v1/completions", &completion(prompt, 9, false))
            .json()
            .unwrap();
        assert_eq!(body["object"], "text_completion");
        let choice = &body["choices"][0];
        assert_eq!(&ids(&choice["token_ids"]), want);
        assert_eq!(choice["finish_reason"], "length");
        let usage = &body["usage"];
        assert_eq!(usage["prompt_tokens"], prompt.len());
        assert_eq!(usage["completion_tokens"], 9);
        assert_eq!(usage["total_tokens"], prompt.len() + 9);

        let events = sse(
            server.post("/v1/completions", &completion(prompt, 9, true)),
            None,
        );
        assert_eq!(events.last().unwrap(), "[DONE]");
        let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], 9);
        assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
        let first: Value = serde_json::from_str(&events[0]).unwrap();
        assert_eq!(first.get("usage"), Some(&Value::Null), "{first}");
        assert_eq!(
            streamed(&events),
            (want.clone(), Some("length".to_string()))
        );
    }
    let models: Value = client()
        .get(server.url("/v1/models"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(models["data"][0]["id"], "tiny");
    let health = client().get(server.url("/health")).send().unwrap();
    assert_eq!(health.status(), 200);
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_goes_on() {
    let server = Server::start(&["--slots", "2"]);
    let send = |path: &str, body: &str| {
        let response = client()
            .post(server.url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().unwrap();
        (status, body)
    };
    let huge = format!("{{\"prompt\": \"{}\"}}", "a".repeat(3 << 20));
    let cases: [(&str, &str, u16, &str); 9] = [
        ("/v1/completions", &huge, 413, "length limit"),
        ("/v1/completions", "{not json", 400, "the request body"),
        (
            "/v1/completions",
            r#"{"prompt": [1], "colour": 3}"#,
            400,
            "unknown field `colour`",
        ),
        (
            "/v1/completions",
            r#"{"prompt": [1], "top_p": 2}"#,
            400,
            "top_p",
        ),
        (
            "/v1/completions",
            r#"{"prompt": []}"#,
            400,
            "prompt is empty",
        ),
        (
            "/v1/completions",
            r#"{"prompt": [1, 97]}"#,
            400,
            "outside the vocabulary of 97",
        ),
        (
            "/v1/completions",
            r#"{"prompt": [1, 2], "max_tokens": 200}"#,
            400,
            "the 128 of a slot",
        ),
        (
            "/v1/completions",
            r#"{"model": "other", "prompt": [1]}"#,
            404,
            "`other` does not exist",
        ),
        ("/v1/nothing", "{}", 404, "no such endpoint"),
    ];
    for (path, body, status, message) in cases {
        let (got, answer) = send(path, body);
        assert_eq!(got, status, "{body}: {answer}");
        let error = &answer["error"];
        let text = error["message"].as_str().unwrap();
        assert!(text.contains(message), "{body}: {text}");
        assert!(
            error["type"].is_string()
                && error.get("param").is_some()
                && error.get("code").is_some()
        );
    }
    // The server still answers, and counted what it refused.
    let body: Value = server
        .post("/v1/completions", &completion(&[1, 2], 3, false))
        .json()
        .unwrap();
    assert_eq!(ids(&body["choices"][0]["token_ids"]).len(), 3);
    let metrics = server.metrics_text();
    for (reason, count) in [("invalid", 7), ("model_not_found", 1)] {
        let line = format!("kiln_requests_refused_total{{reason=\"{reason}\"}} {count}\n");
        assert!(metrics.contains(&line), "{metrics}");
    }
}

#[test]
fn sixty_four_streams_with_sixteen_leaving_mid_stream_leave_the_rest_their_tokens() {
    let server = Server::start(&["--slots", "8"]);
    let new_tokens = 12;
    let prompts: Vec<Vec<u32>> = (0..64u32)
        .map(|i| {
            (0..1 + (i * 7) % 23)
                .map(|t| (i * 31 + t * 13) % 97)
                .collect()
        })
        .collect();
    let want = generate_greedy(&prompts, new_tokens);
    let results: Vec<(Vec<u32>, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (prompts.iter().enumerate())
            .map(|(i, prompt)| {
                let server = &server;
                scope.spawn(move || {
                    // Every fourth client reads two chunks and hangs up; its request asks
                    // for many tokens, so it cannot finish before the server notices.
                    let leave = (i % 4 == 3).then_some(2);
                    let tokens = if leave.is_some() { 100 } else { new_tokens };
                    let response =
                        server.post("/v1/completions", &completion(prompt, tokens, true));
                    streamed(&sse(response, leave))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, ((tokens, finish), want)) in results.iter().zip(&want).enumerate() {
        match i % 4 == 3 {
            true => assert!(tokens.len() <= 2, "request {i} read past its leaving"),
            false => {
                assert_eq!(tokens, want, "request {i}");
                assert_eq!(finish.as_deref(), Some("length"), "request {i}");
            }
        }
    }
    server.wait_idle();
    let metrics = server.metrics_text();
    assert!(
        metrics.contains(r#"kiln_requests_finished_total{finish_reason="length"} 48"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"kiln_requests_finished_total{finish_reason="cancelled"} 16"#),
        "{metrics}"
    );
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let server = Server::start(&["--slots", "1", "--max-waiting", "1"]);
    // One request holds the slot and one waits; the third finds the queue full.
    let running = server.post("/v1/completions", &completion(&[1], 120, true));
    let waiting = server.post("/v1/completions", &completion(&[2], 4, true));
    let refused = server.post("/v1/completions", &completion(&[3], 4, false));
    assert_eq!(refused.status(), 503);
    assert!(refused.headers().get("retry-after").is_some());
    let body: Value = refused.json().unwrap();
    assert_eq!(body["error"]["code"], "queue_full");
    // With no waiting room at all, an idle server still takes what its free slots hold.
    let strict = Server::start(&["--slots", "2", "--max-waiting", "0"]);
    let taken: Value = strict
        .post("/v1/completions", &completion(&[1], 2, false))
        .json()
        .unwrap();
    assert_eq!(ids(&taken["choices"][0]["token_ids"]).len(), 2, "{taken}");
    assert_eq!(streamed(&sse(running, None)).0.len(), 120);
    assert_eq!(streamed(&sse(waiting, None)).0.len(), 4);
    let metrics = server.metrics_text();
    assert!(
        metrics.contains(r#"kiln_requests_refused_total{reason="queue_full"} 1"#),
        "{metrics}"
    );
}

/// Sends SIGTERM to `server` and waits for it to exit; returns whether it exited 0.
fn terminate(server: &mut Server) -> bool {
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let start = Instant::now();
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            return status.success();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "kiln serve still runs 60 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_finishes_requests_in_flight_then_exits_0() {
    let mut server = Server::start(&["--slots", "2"]);
    let response = server.post("/v1/completions", &completion(&[4, 5], 100, true));
    let mut reader = BufReader::new(response);
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(first.starts_with("data: "), "{first}");
    let base = server.base.clone();
    let exited = std::thread::scope(|scope| {
        let rest = scope.spawn(move || {
            let mut rest = String::new();
            reader.read_to_string(&mut rest).unwrap();
            rest
        });
        let exited = terminate(&mut server);
        (exited, rest.join().unwrap())
    });
    let (exited_ok, rest) = exited;
    assert!(exited_ok, "kiln serve did not exit 0 after SIGTERM");
    let events: Vec<String> = std::iter::once(first.trim_end().to_string())
        .chain(rest.lines().map(str::to_string))
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect();
    let (tokens, finish) = streamed(&events);
    assert_eq!((tokens.len(), finish.as_deref()), (100, Some("length")));
    assert!(
        client().get(format!("{base}/health")).send().is_err(),
        "still listening"
    );
}

#[test]
fn past_the_drain_deadline_requests_are_cancelled() {
    let mut server = Server::start(&["--slots", "1", "--drain-seconds", "0"]);
    let response = server.post("/v1/completions", &completion(&[4, 5], 120, true));
    let mut reader = BufReader::new(response);
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(
        terminate(&mut server),
        "kiln serve did not exit 0 after SIGTERM"
    );
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    let events: Vec<String> = (rest.lines())
        .filter_map(|l| l.strip_prefix("data: ").map(str::to_string))
        .collect();
    let (tokens, finish) = streamed(&events);
    assert!(
        tokens.len() < 119,
        "{} tokens after the deadline",
        tokens.len()
    );
    // Cut off by the deadline: no finish reason, an OpenAI error event, then [DONE].
    assert_eq!(finish, None);
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["code"], "shutting_down", "{error}");
    assert_eq!(events.last().unwrap(), "[DONE]");
}

#[test]
fn a_client_that_never_finishes_its_request_does_not_hold_the_shutdown() {
    let mut server = Server::start(&["--slots", "1", "--drain-seconds", "0"]);
    let address = server.base.trim_start_matches("http://").to_string();
    let mut stalled = std::net::TcpStream::connect(address).unwrap();
    std::io::Write::write_all(&mut stalled, b"POST /v1/completions HTTP/1.1\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    assert!(
        terminate(&mut server),
        "kiln serve did not exit 0 after SIGTERM"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// `kiln generate --model DIR --temperature 0` text for `prompt` (`--chat` with `chat`).
fn generate_text(dir: &std::path::Path, prompt: &str, chat: bool, extra: &[&str]) -> String {
    let out = dir.join(format!("generated-{}.json", rand_name()));
    let status = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "generate",
            "--temperature",
            "0",
            "--max-new-tokens",
            "12",
            "--prompt",
            prompt,
        ])
        .arg("--model")
        .arg(dir)
        .args(chat.then_some("--chat"))
        .args(extra)
        .arg("--json")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let report: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    std::fs::remove_file(out).unwrap();
    report["requests"][0]["text"].as_str().unwrap().to_string()
}

fn rand_name() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// The text of a stream's chunks: completions' `text`, chat's `delta.content`.
fn streamed_text(events: &[String]) -> String {
    let mut text = String::new();
    for data in events.iter().filter(|d| *d != "[DONE]") {
        let chunk: Value = serde_json::from_str(data).unwrap();
        for choice in chunk["choices"].as_array().unwrap() {
            let piece = choice
                .get("text")
                .or_else(|| choice["delta"].get("content"));
            text.push_str(piece.and_then(Value::as_str).unwrap_or_default());
        }
    }
    text
}

#[test]
fn chat_and_text_on_a_tokenized_model_give_kiln_generates_text() {
    let dir = tempfile::tempdir().unwrap();
    tokenized_model::tokenized_tiny_model(dir.path(), 3);
    let model = dir.path().to_str().unwrap();
    let server = Server::serving(model, &["--served-model-name", "kiln-tiny", "--slots", "2"]);
    let prompt = "the kiln fires clay";
    let chat = |stream: bool, extra: Value| {
        let mut body = json!({
            "model": "kiln-tiny",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 12,
            "temperature": 0,
            "stream": stream,
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        server.post("/v1/chat/completions", &body)
    };
    let whole: Value = chat(false, json!({})).json().unwrap();
    assert_eq!(whole["object"], "chat.completion");
    let message = &whole["choices"][0]["message"];
    assert_eq!(message["role"], "assistant");
    let content = message["content"].as_str().unwrap();
    assert_eq!(content, generate_text(dir.path(), prompt, true, &[]));
    let events = sse(chat(true, json!({})), None);
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(streamed_text(&events), content);

    let text = |stream: bool, extra: Value| {
        let mut body =
            json!({"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": stream});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        server.post("/v1/completions", &body)
    };
    let whole: Value = text(false, json!({})).json().unwrap();
    let completion = whole["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(completion, generate_text(dir.path(), prompt, false, &[]));
    assert_eq!(streamed_text(&sse(text(true, json!({})), None)), completion);
    // A stop string from the middle of the text: the text ends before it, streamed alike.
    let middle = completion.len() / 2;
    let stop: String = completion[middle..].chars().take(3).collect();
    assert!(
        stop.len() == 3,
        "{completion:?} is too short for a stop string"
    );
    let cut = &completion[..completion.find(&stop).unwrap()];
    let whole: Value = text(false, json!({"stop": [stop.clone()]})).json().unwrap();
    assert_eq!(whole["choices"][0]["text"], cut);
    assert_eq!(whole["choices"][0]["finish_reason"], "stop");
    let events = sse(text(true, json!({"stop": stop.clone()})), None);
    assert_eq!(streamed_text(&events), cut);
    assert_eq!(
        cut,
        generate_text(dir.path(), prompt, false, &["--stop", &stop])
    );
}

#[test]
fn the_openai_python_client_gets_what_it_expects() {
    let probe = Command::new("python3")
        .args(["-c", "import openai"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        let why = "the `openai` Python package cannot be imported (pip install openai)";
        assert!(
            std::env::var("KILN_REQUIRE_OPENAI").as_deref() != Ok("1"),
            "{why}"
        );
        println!("SKIPPED: the openai client check: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    tokenized_model::tokenized_tiny_model(dir.path(), 5);
    let model = dir.path().to_str().unwrap();
    let server = Server::serving(model, &["--served-model-name", "kiln-tiny", "--slots", "2"]);
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/python/openai_client.py"
        ))
        .arg(server.url("/v1"))
        .arg("kiln-tiny")
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    println!("{report}");
    assert!(
        out.status.success(),
        "{report}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
