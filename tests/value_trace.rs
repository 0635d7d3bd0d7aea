//! Value tracing (`kiln eval --trace`): a traced run's other outputs are bit-identical to an
//! untraced run's, in every engine and with gradients; each traced value equals the eager
//! oracle's value at that point; the traced values are consistent with each other and with
//! the outputs; tracing adds outputs and nothing else to the program.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use kiln_frontend::eval::{
    evaluate_program_traced, evaluate_traced, traceable_values, Engine, Evaluation,
};
use kiln_frontend::hf::safetensors_io::{write_safetensors, SafetensorsFile};
use kiln_frontend::model::{random_weights, ModelConfig, Precision};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_frontend::value_trace::{add_trace_outputs, TracePatterns};
use kiln_ir::DType;
use kiln_kernels::testing;
use kiln_runtime::{Backend, RunMode, Tensor};

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Every tensor of an evaluation by the name `kiln eval` writes it under.
fn by_name(result: &Evaluation) -> BTreeMap<String, Vec<u64>> {
    let mut all = BTreeMap::new();
    all.insert("logits".to_string(), bits(&result.logits));
    all.insert("loss".to_string(), bits(&result.loss));
    for (name, grad) in &result.grads {
        all.insert(format!("grad.{name}"), bits(grad));
    }
    for (name, value) in &result.traces {
        all.insert(format!("trace.{name}"), bits(value));
    }
    all
}

fn patterns(flags: &[&str]) -> TracePatterns {
    TracePatterns::parse(flags).unwrap()
}

#[test]
fn traced_runs_keep_every_other_output_and_equal_the_oracle() {
    let mut rng = testing::rng("traced_runs_keep_every_other_output");
    let backend = Backend::Cpu;
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
        let ids = testing::indices(&mut rng, 2 * 5, config.vocab_size);
        let tokens = Tensor::from_vec(ids, [2, 5]).unwrap();
        let everything = patterns(&["*"]);
        let untraced = TracePatterns::default();
        let names: Vec<String> = traceable_values(&config, &tokens, Precision::F32)
            .unwrap()
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        let layers = config.num_hidden_layers;
        assert_eq!(names.len(), 2 + 9 * layers + 1, "{names:?}");
        for grads in [false, true] {
            let how = (grads, Precision::F32);
            let oracle = evaluate_traced(&config, &weights, &tokens, how, &everything).unwrap();
            let oracle_names: Vec<&str> = oracle.traces.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                oracle_names, names,
                "the oracle names what the program names"
            );
            let plain_oracle = evaluate_traced(&config, &weights, &tokens, how, &untraced).unwrap();
            assert!(plain_oracle.traces.is_empty());
            let oracle = by_name(&oracle);
            for label in ["interpret", "planned", "graph"] {
                let engine = || match label {
                    "interpret" => Engine::Interpret,
                    "planned" => Engine::Planned {
                        backend: &backend,
                        mode: RunMode::Eager,
                    },
                    _ => Engine::Planned {
                        backend: &backend,
                        mode: RunMode::Graph,
                    },
                };
                let run = |trace: &TracePatterns| {
                    evaluate_program_traced(&config, &weights, &tokens, how, engine(), trace)
                        .unwrap()
                };
                let plain = by_name(&run(&untraced));
                let traced = by_name(&run(&everything));
                let context = format!("{:?} {label} grads {grads}", config.family);
                for (name, value) in &plain {
                    assert_eq!(traced.get(name), Some(value), "{context}: {name} changed");
                }
                assert_eq!(traced.len(), plain.len() + names.len(), "{context}");
                for (name, value) in &traced {
                    assert_eq!(
                        oracle.get(name),
                        Some(value),
                        "{context}: {name} vs the oracle"
                    );
                }
                assert_eq!(traced["trace.logits"], traced["logits"], "{context}");
            }
        }
    }
}

#[test]
fn traced_values_are_consistent_with_each_other() {
    let config = ModelConfig::tiny();
    let weights = random_weights(&config, 7).unwrap();
    let tokens =
        Tensor::from_vec((0..12).map(|i| (i * 13) % 97).collect::<Vec<i64>>(), [2, 6]).unwrap();
    let how = (false, Precision::F32);
    let engine = Engine::Planned {
        backend: &Backend::Cpu,
        mode: RunMode::Eager,
    };
    let trace = patterns(&["embed", "layers.*", "norm"]);
    let result = evaluate_program_traced(&config, &weights, &tokens, how, engine, &trace).unwrap();
    let values: BTreeMap<&str, Vec<f32>> = (result.traces.iter())
        .map(|(name, t)| (name.as_str(), t.to_vec::<f32>().unwrap()))
        .collect();
    assert!(
        !values.contains_key("logits"),
        "only what the patterns select"
    );
    let sum = |a: &str, b: &str| -> Vec<f32> {
        values[a]
            .iter()
            .zip(&values[b])
            .map(|(x, y)| x + y)
            .collect()
    };
    // The residual stream: each block's output added to the stream before it.
    assert_eq!(
        values["layers.0.attn.residual"],
        sum("embed", "layers.0.attn.out")
    );
    for layer in 0..config.num_hidden_layers {
        let before = match layer {
            0 => "embed".to_string(),
            _ => format!("layers.{}.residual", layer - 1),
        };
        let attn = format!("layers.{layer}.attn");
        assert_eq!(
            values[format!("{attn}.residual").as_str()],
            sum(&before, &format!("{attn}.out")),
            "layer {layer} after attention"
        );
        assert_eq!(
            values[format!("layers.{layer}.residual").as_str()],
            sum(
                &format!("{attn}.residual"),
                &format!("layers.{layer}.mlp.out")
            ),
            "layer {layer} after the MLP"
        );
    }
    // The final norm of the last residual stream, with the norm weight (rows of 64).
    let last = &values[format!("layers.{}.residual", config.num_hidden_layers - 1).as_str()];
    let weight = weights.norm.value().to_vec::<f32>().unwrap();
    let hidden = weight.len();
    for (row, normed) in last.chunks(hidden).zip(values["norm"].chunks(hidden)) {
        let mean_square = row.iter().map(|x| (x * x) as f64).sum::<f64>() / hidden as f64;
        let scale = 1.0 / (mean_square + config.rms_norm_eps).sqrt();
        for ((x, w), got) in row.iter().zip(&weight).zip(normed) {
            let want = *x as f64 * scale * *w as f64;
            assert!(
                (want - *got as f64).abs() <= 1e-5 * want.abs().max(1.0),
                "{want} vs {got}"
            );
        }
    }
}

#[test]
fn tracing_adds_outputs_and_nothing_else() {
    let config = ModelConfig::tiny();
    for grads in [false, true] {
        let options = ProgramOptions {
            batch: 2,
            seq: 4,
            grads,
            ..ProgramOptions::default()
        };
        let untraced = build(ProgramKind::Eval, &config, &options).unwrap();
        let mut traced = untraced.clone();
        let outputs = add_trace_outputs(&mut traced, &patterns(&["layers.1.*", "logits"])).unwrap();
        assert_eq!(outputs.len(), 10, "{outputs:?}");
        assert_eq!(outputs[0], "trace.layers.1.attn.norm");
        let text = kiln_ir::print(&traced);
        let without: Vec<&str> = (text.lines())
            .filter(|line| !line.starts_with("  output trace."))
            .collect();
        let mut without = without.join("\n");
        without.push('\n');
        assert_eq!(without, kiln_ir::print(&untraced), "grads {grads}");
    }
    let mut graph = build(ProgramKind::Eval, &config, &ProgramOptions::default()).unwrap();
    let error = add_trace_outputs(&mut graph, &patterns(&["logits", "layer.*"]))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("--trace layer.*: matches no value name; names are: embed,"),
        "{error}"
    );
}

fn write_tokens(path: &Path) {
    let ids: Vec<i64> = (0..16).map(|i| (i * 31) % 97).collect();
    let tokens = Tensor::from_vec(ids, [2, 8]).unwrap();
    write_safetensors(path, &[("tokens".to_string(), tokens)], None).unwrap();
}

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

#[test]
fn kiln_eval_writes_traced_values_and_names_bad_patterns() {
    let scratch = tempfile::tempdir().unwrap();
    let tokens = scratch.path().join("tokens.safetensors");
    write_tokens(&tokens);
    let tokens = tokens.to_str().unwrap();
    let plain = scratch.path().join("plain.safetensors");
    let traced = scratch.path().join("traced.safetensors");
    let base = [
        "eval", "--model", "tiny", "--tokens", tokens, "--mode", "planned", "--grads",
    ];
    let run = |out: &Path, extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend(["--out", out.to_str().unwrap()]);
        args.extend(extra);
        let output = kiln(&args);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    run(&plain, &[]);
    run(
        &traced,
        &["--trace", "layers.*.attn.out", "--trace", "norm,logits"],
    );
    let (plain, traced) = (
        SafetensorsFile::open(&plain).unwrap(),
        SafetensorsFile::open(&traced).unwrap(),
    );
    let traced_names: Vec<String> = (traced.names().into_iter())
        .filter(|n| n.starts_with("trace."))
        .collect();
    assert_eq!(
        traced_names,
        [
            "trace.layers.0.attn.out",
            "trace.layers.1.attn.out",
            "trace.logits",
            "trace.norm"
        ]
    );
    for name in plain.names() {
        let read = |file: &SafetensorsFile| bits(&file.tensor(&name, DType::F32).unwrap());
        assert_eq!(read(&plain), read(&traced), "{name}");
    }
    let logits = traced.tensor("logits", DType::F32).unwrap();
    assert_eq!(
        bits(&traced.tensor("trace.logits", DType::F32).unwrap()),
        bits(&logits)
    );

    let listed = kiln(&[
        "eval", "--model", "tiny", "--tokens", tokens, "--out", "unused", "--trace", "list",
    ]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success());
    assert!(text.contains("layers.1.attn.q  f32 [2,4,8,16]"), "{text}");
    assert!(!Path::new("unused").exists());

    let bad = kiln(
        &[
            &base[..],
            &["--out", "unused", "--trace", "layers.*.attention"],
        ]
        .concat(),
    );
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        stderr.contains("--trace layers.*.attention: matches no value name"),
        "{stderr}"
    );
    assert!(stderr.contains("layers.0.attn.norm"), "{stderr}");
}
