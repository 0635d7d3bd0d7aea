//! Every launch a builder can produce names an `extern "C" __global__` function of its module
//! and passes an argument of the C signature's type for each parameter, in order.

use super::attention::{AttentionBackward, AttentionDims, AttentionForward};
use super::cache::CacheRows;
use super::linear::{LinearGroup, SkinnyLinear};
use super::norm::RmsNormBackwardRows;
use super::optim::AdamWHyper;
use super::rope::RopeDims;
use super::*;
use kiln_ir::DType;
use kiln_ir::EmbeddingRows;

const F32: Stored = Stored::F32;
const BF16: Stored = Stored::BF16;

/// The kind of argument a C parameter declaration takes (`const float* x`, `i64 rows`, ...):
/// the [`Arg`] variant's name, or `None` for a type no builder may pass.
fn parameter_kind(declaration: &str) -> Option<&'static str> {
    let declaration = declaration.trim();
    if declaration.contains('*') {
        return Some("Ptr");
    }
    let ty = declaration.rsplit_once(char::is_whitespace)?.0.trim();
    match ty.trim_start_matches("const ") {
        "i64" | "long long" => Some("I64"),
        "int" => Some("I32"),
        "float" => Some("F32"),
        "double" => Some("F64"),
        _ => None,
    }
}

/// `source` as the signature checks read it: without the launch-bounds macros
/// (`KILN_..._BOUNDS`, between `void` and a kernel's name), and with each entry-point macro
/// (`#define KILN_..._ENTRY(params)`, one kernel a use) expanded where it is used, its
/// definition dropped.
pub(crate) fn expanded(source: &str) -> String {
    let bounds = |word: &&str| {
        (word.strip_suffix(' ')).is_some_and(|w| w.starts_with("KILN_") && w.ends_with("_BOUNDS"))
    };
    let source: String = source.split_inclusive(' ').filter(|w| !bounds(w)).collect();
    let mut macros: Vec<(String, Vec<&str>, String)> = Vec::new();
    let mut out = String::new();
    let mut lines = source.lines();
    while let Some(line) = lines.next() {
        let head = line
            .strip_prefix("#define ")
            .and_then(|rest| rest.split_once('('));
        if let Some((name, rest)) = head.filter(|(name, _)| name.ends_with("_ENTRY")) {
            let (params, first) = rest.split_once(')').expect("a macro's parameter list");
            let mut body = first.trim_end_matches('\\').to_string();
            let mut last = line;
            while last.ends_with('\\') {
                last = lines.next().expect("a continued line");
                body.push('\n');
                body.push_str(last.trim_end_matches('\\'));
            }
            macros.push((
                name.to_string(),
                params.split(',').map(str::trim).collect(),
                body,
            ));
            continue;
        }
        let used = macros
            .iter()
            .find(|(name, ..)| line.starts_with(&format!("{name}(")));
        match used {
            Some((name, params, body)) => {
                let args = &line[name.len() + 1..line.rfind(')').expect("a closed use")];
                let args: Vec<&str> = args.split(',').map(str::trim).collect();
                assert_eq!(args.len(), params.len(), "{line}");
                out.push_str(&substitute(body, params, &args));
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    assert!(
        !out.contains("_ENTRY("),
        "an entry-point macro used where it is not expanded"
    );
    out
}

/// `body` with each identifier among `params` outside string literals replaced by its argument,
/// as the preprocessor does.
fn substitute(body: &str, params: &[&str], args: &[&str]) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in body.chars().chain(['\n']) {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        match params.iter().position(|p| *p == word).filter(|_| !quoted) {
            Some(i) => out.push_str(args[i]),
            None => out.push_str(&word),
        }
        word.clear();
        quoted ^= c == '"';
        out.push(c);
    }
    out.pop();
    out
}

#[test]
fn entry_point_macros_expand_into_one_kernel_a_use() {
    let source = "\
#define KILN_PAIR_ENTRY(name, C)                 \\
    extern \"C\" __global__ void name(C* x) {      \\
        kiln_twice<C>(x, kiln_name_of_C);        \\
    }
KILN_PAIR_ENTRY(pair_f32, float)
KILN_PAIR_ENTRY(pair_bf16, bf16_bits)
";
    let text = expanded(source);
    assert!(!text.contains("#define"));
    assert_eq!(text.matches("extern \"C\" __global__ void ").count(), 2);
    assert!(text.contains("void pair_f32(float* x) {"));
    // Names are replaced as whole identifiers only, and not within string literals.
    assert!(text.contains("kiln_twice<bf16_bits>(x, kiln_name_of_C);"));
    assert!(!text.contains("extern \"float\""), "{text}");
}

/// The argument kind of each parameter of `extern "C" __global__ void function(...)` in
/// `module`'s source, in order.
pub(crate) fn parameter_kinds(module: &str, function: &str) -> Option<Vec<Option<&'static str>>> {
    let (_, source) = SOURCES.iter().find(|(name, _)| *name == module)?;
    let source = expanded(source);
    let head = format!("extern \"C\" __global__ void {function}(");
    let start = source.find(&head)? + head.len();
    let params = &source[start..start + source[start..].find(')')?];
    let declarations = params.split(',').filter(|p| !p.trim().is_empty());
    Some(declarations.map(parameter_kind).collect())
}

fn arg_kind(arg: &Arg) -> &'static str {
    match arg {
        Arg::Ptr(_) | Arg::Null => "Ptr",
        Arg::I64(_) => "I64",
        Arg::I32(_) => "I32",
        Arg::F32(_) => "F32",
        Arg::F64(_) => "F64",
    }
}

#[test]
fn parameter_declarations_read_as_their_argument_kinds() {
    assert_eq!(parameter_kind(" const float* logits"), Some("Ptr"));
    assert_eq!(parameter_kind("int* fault"), Some("Ptr"));
    assert_eq!(parameter_kind("\n  i64 rows"), Some("I64"));
    assert_eq!(parameter_kind("int has_bias"), Some("I32"));
    assert_eq!(parameter_kind("float scale"), Some("F32"));
    assert_eq!(parameter_kind("const double eps"), Some("F64"));
    assert_eq!(parameter_kind("unsigned rows"), None);
}

fn addr(slot: u32) -> Addr {
    Addr { slot, offset: 0 }
}

/// An address that is 4- but not 16-byte aligned: the scalar kernels.
fn unaligned(slot: u32) -> Addr {
    Addr { slot, offset: 4 }
}

fn every_launch() -> Vec<Launch> {
    let dims = AttentionDims {
        batch: 2,
        q_heads: 4,
        kv_heads: 2,
        q_len: 3,
        kv_len: 5,
        head_dim: 8,
    };
    let forward = AttentionForward {
        q: addr(0),
        k: addr(1),
        v: addr(2),
        out: addr(3),
        probs: addr(4),
    };
    let backward = AttentionBackward {
        q: addr(0),
        k: addr(1),
        v: addr(2),
        probs: addr(3),
        grad_out: addr(4),
        grad_q: addr(5),
        grad_k: addr(6),
        grad_v: addr(7),
        workspace: addr(8),
    };
    let (flash_forward, flash_backward) = (flash::tests::forward(), flash::tests::backward());
    let rope_dims = RopeDims {
        batch: 1,
        seq: 2,
        heads: 3,
        head_dim: 4,
    };
    // A result written in f32, rounded to bf16, or both (`Rounded`, `AlsoRounded`).
    let forms = [
        Forms::f32(addr(0)),
        Forms {
            f32: None,
            rounded: Some(addr(6)),
        },
        Forms {
            f32: Some(addr(0)),
            rounded: Some(addr(6)),
        },
    ];
    let rows = RmsNormBackwardRows {
        grad_x: forms[2],
        rstd: addr(1),
        x: addr(2),
        weight: addr(3),
        grad_out: addr(4),
        grad_sum: Some(addr(5)),
    };
    let hyper = AdamWHyper {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let (own, pool) = (
        CacheRows::Own,
        CacheRows::Pool {
            rows: addr(3),
            slots: 5,
        },
    );
    let sizes = [1, 2, 8, 1, 4];
    let mut launches = vec![
        activation::softmax_f32(addr(0), addr(1), 2, 3).unwrap(),
        activation::argmax_f32(addr(0), addr(1), 2, 3).unwrap(),
        activation::softmax_backward_f32(addr(0), addr(1), addr(2), 2, 3).unwrap(),
        cache::kv_cache_write_f32((addr(0), F32), addr(1), (addr(2), own), sizes, addr(9)),
        cache::kv_cache_write_f32((addr(0), BF16), addr(1), (addr(2), pool), sizes, addr(9)),
        copy::cast_f32_to_bf16(addr(0), addr(1), 3),
        copy::cast_bf16_to_f32(addr(0), addr(1), 3),
        copy::cast_f32_to_bf16(addr(0), addr(1), 8),
        copy::cast_bf16_to_f32(addr(0), addr(1), 8),
        elementwise::broadcast_to_f32(addr(0), addr(1), 12, 3),
        embedding::embedding_f32(addr(0), (addr(1), F32), addr(2), [3, 4, 10], addr(9)).unwrap(),
        embedding::embedding_f32(addr(0), (addr(1), BF16), addr(2), [3, 4, 10], addr(9)).unwrap(),
        embedding::zero_f32(addr(0), 40),
        embedding::zero_bf16(addr(0), 40),
        embedding::embedding_base_f32(addr(0), (addr(1), F32), 40),
        embedding::embedding_base_f32(addr(0), (addr(1), BF16), 40),
        embedding::embedding_backward_f32(addr(0), addr(1), addr(2), None, [3, 4, 10], addr(9))
            .unwrap(),
        embedding::embedding_backward_f32(
            addr(0),
            addr(1),
            addr(2),
            Some((addr(3), BF16)),
            [3, 4, 10],
            addr(9),
        )
        .unwrap(),
        loss::cross_entropy_rows_f32(addr(0), addr(1), addr(2), ([3, 7], -100), addr(9)).unwrap(),
        loss::cross_entropy_mean_f32(addr(0), addr(1), addr(2), 3, -100),
        loss::cross_entropy_backward_f32(addr(0), [addr(1); 3], ([3, 7], -100), addr(9)).unwrap(),
        optim::adamw(adamw_update(Stored::F32, None, Some(addr(7))), 9, hyper),
        optim::adamw(adamw_update(Stored::F32, Some(addr(6)), None), 12, hyper),
        optim::adamw(adamw_update(Stored::BF16, None, Some(addr(7))), 9, hyper),
        optim::adamw(adamw_update(Stored::BF16, Some(addr(6)), None), 12, hyper),
        optim::clip_grad_norm_partial(addr(0), 1000, addr(1)),
        optim::clip_grad_norm_finish(addr(0), 7, 1.0, [addr(1), addr(2)]),
    ];
    // RoPE of every output and bias storage, and without a bias.
    let positions = [addr(1), addr(2)];
    let ropes = [
        (F32, None),
        (F32, Some(F32)),
        (F32, Some(BF16)),
        (BF16, Some(F32)),
        (BF16, Some(BF16)),
    ];
    for (out, bias) in ropes {
        let bias = (bias.map(|_| addr(3)), bias.unwrap_or(F32));
        let rope = rope::rope_f32((addr(0), out), positions, bias, (rope_dims, 1e4), addr(9));
        launches.push(rope);
    }
    for grad_x in forms {
        let rows = RmsNormBackwardRows { grad_x, ..rows };
        launches.push(norm::rmsnorm_backward_rows_f32(rows, 3, 8, 1e-6).unwrap());
        let rope = rope::rope_backward_f32(grad_x, positions, (rope_dims, 1e4), addr(9));
        launches.push(rope);
        let copy = copy::strided_copy_f32(grad_x, addr(1), &[2, 3], &[1, 2]);
        launches.push(copy.unwrap());
    }
    // An embedding's update: no base, an f32 or a bf16 one; with a copy or not; vectors or
    // not (a hidden size of 4 or 3); within one window of tokens or past it.
    let cases = [(None, None, 4, 3), (Some(F32), Some(addr(6)), 3, 3)];
    let more = [
        (Some(BF16), Some(addr(6)), 4, 5000),
        (Some(BF16), None, 3, 3),
    ];
    for (base, copy, hidden, tokens) in cases.into_iter().chain(more) {
        let update = embedding::EmbeddingAdamW {
            param: addr(0),
            m: addr(1),
            v: addr(2),
            copy,
            step: addr(4),
            lr: addr(5),
            ids: addr(7),
            grad_out: Some(addr(3)),
            base: base.map(|stored| (addr(10), stored)),
            workspace: addr(8),
        };
        let sizes = [tokens, hidden, 10];
        for rows in [EmbeddingRows::Unnamed, EmbeddingRows::Named] {
            let update = embedding::embedding_adamw(update, rows, sizes, hyper, addr(9));
            launches.extend(update.unwrap());
        }
    }
    // Column sums of one chunk of rows and of several (partials, then the finish).
    for rows in [4, 2048] {
        let sums = [rows, 896];
        launches.extend(elementwise::sum_to_shape_f32(addr(0), addr(1), sums, addr(8)).unwrap());
        let operands = [addr(1), addr(2), addr(3)];
        let norm = norm::rmsnorm_backward_weight_f32(addr(0), operands, sums, addr(8));
        launches.extend(norm.unwrap());
    }
    // The kernels of the multi-launch builders (their GEMMs are checked by the lowering tests).
    let pipelines = [
        decode::cached_attention_f32(
            addr(0),
            addr(1),
            [addr(2); 4],
            own,
            (dims, 0.5, F32),
            addr(9),
        )
        .unwrap(),
        decode::cached_attention_f32(
            addr(0),
            addr(1),
            [addr(2); 4],
            pool,
            (dims, 0.5, BF16),
            addr(9),
        )
        .unwrap(),
        attention::attention_f32(forward, dims, 0.5).unwrap(),
        attention::attention_backward_f32(backward, dims, 0.5).unwrap(),
    ];
    // The chunked LM-head loss, and with its gradient in one, in f32 and bf16 (its GEMMs are
    // not kernels).
    for dtype in [GemmDType::F32, GemmDType::BF16] {
        let loss = loss::LinearLoss::new([3, 8, 300], dtype, -100);
        let forward = loss::LinearLossForward {
            x: addr(0),
            weight: addr(1),
            targets: addr(2),
            loss: addr(3),
            lse: addr(4),
        };
        let backward = loss::LinearLossBackward {
            x: addr(0),
            weight: addr(1),
            targets: addr(2),
            lse: addr(4),
            grad_loss: addr(5),
            grad_x: addr(6),
            grad_weight: addr(7),
        };
        let fused = loss::LinearLossGrad {
            x: addr(0),
            weight: addr(1),
            targets: addr(2),
            grad_loss: addr(5),
            loss: addr(3),
            grad_x: addr(6),
            grad_weight: addr(7),
        };
        let both = [
            loss.forward(&forward, addr(8), addr(9)).unwrap(),
            loss.backward(&backward, addr(8), addr(9)).unwrap(),
            loss.fused(&fused, addr(8), addr(9)).unwrap(),
        ];
        let kernels = both.into_iter().flatten();
        launches.extend(kernels.filter(|launch| matches!(launch, Launch::Kernel(_))));
    }
    // Every head-dim instance of the flash kernels, with f32 and bf16 operands (staged from
    // either), and of the f16 forward; the forwards in two warp groups (8 blocks) and in one
    // (T = 1088: 136 blocks).
    for (head_dim, q_len) in [8, 32, 64, 128]
        .into_iter()
        .flat_map(|d| [(d, 3), (d, 1088)])
    {
        let dims = AttentionDims {
            head_dim,
            q_len,
            kv_len: q_len + 2,
            ..dims
        };
        let f16 = flash::FlashForward {
            rounding: DType::F16,
            ..flash_forward
        };
        launches.extend(flash::flash_attention_f32(f16, dims, 0.5).unwrap());
        let f16_rows = flash::FlashForward {
            stored: [DType::F16; 3],
            ..f16
        };
        launches.extend(flash::flash_attention_f32(f16_rows, dims, 0.5).unwrap());
        for stored in [F32, BF16] {
            // The output in f32 alone, or both ways.
            let out = if stored == BF16 { forms[2] } else { forms[0] };
            let forward = flash::FlashForward {
                stored: [stored.dtype(); 3],
                out,
                ..flash_forward
            };
            let backward = flash::FlashBackward {
                stored: [stored.dtype(); 4],
                ..flash_backward
            };
            launches.extend(flash::flash_attention_f32(forward, dims, 0.5).unwrap());
            launches.extend(flash::flash_attention_backward_f32(backward, dims, 0.5).unwrap());
        }
    }
    // Every main kernel of the skinny linear layer (one row on CUDA cores, 8 to 32 padded rows
    // on tensor cores), k split (so with its reduce kernel: no clusters).
    let group = |slot, n| LinearGroup {
        w: addr(slot),
        bias: Some(addr(slot + 1)),
        out: addr(slot + 2),
        n,
        ldo: n,
    };
    for m in [1, 8, 16, 24, 32] {
        let spec = SkinnyLinear {
            x: addr(0),
            x_dtype: GemmDType::BF16,
            m,
            k: 896,
            ldx: 896,
            groups: vec![group(1, 896), group(4, 128)],
            swiglu: false,
        };
        launches.extend(linear::skinny_linear(&spec, Some(addr(9)), false).unwrap());
        // The norm epilogue after one group, split (k = 4864), with either norm weight.
        for stored in [F32, BF16] {
            let spec = SkinnyLinear {
                k: 4864,
                ldx: 4864,
                groups: vec![group(1, 896)],
                ..spec.clone()
            };
            let norm = linear::NormEpilogue {
                residual: addr(10),
                weight: addr(11),
                stored,
                normed: addr(12),
                eps: 1e-6,
            };
            let launched =
                linear::skinny_linear_add_rmsnorm(&spec, Some(addr(9)), norm, false).unwrap();
            launches.extend(launched);
        }
    }
    // q/k/v with the RoPE and cache epilogue: one row finished in clusters (linear_r1_rope),
    // eight rows by linear_reduce_rope.
    for (m, clusters) in [(1, true), (8, true), (1, false)] {
        let spec = SkinnyLinear {
            x: addr(0),
            x_dtype: GemmDType::BF16,
            m,
            k: 896,
            ldx: 896,
            groups: vec![group(1, 896), group(4, 128), group(7, 128)],
            swiglu: false,
        };
        let rope = linear::RopeEpilogue {
            q_rot: addr(10),
            k_cache: addr(11),
            v_cache: addr(12),
            rope_positions: addr(13),
            positions: addr(14),
            rows: super::cache::CacheRows::Pool {
                rows: addr(15),
                slots: 4,
            },
            seq: 1,
            capacity: 64,
            head_dim: 64,
            theta: 1e6,
        };
        let launched = linear::skinny_linear_rope(&spec, addr(9), rope, clusters, addr(16));
        launches.extend(launched.unwrap());
    }
    let kernels = pipelines.into_iter().flatten();
    launches.extend(kernels.filter(|launch| matches!(launch, Launch::Kernel(_))));
    // The tiled GEMM of every dtype combination.
    for (dtype, out) in [
        (GemmDType::F32, GemmDType::F32),
        (GemmDType::BF16, GemmDType::F32),
        (GemmDType::BF16, GemmDType::BF16),
    ] {
        let gemm = Gemm {
            dtype,
            out,
            a: addr(0),
            b: addr(1),
            c: addr(2),
            m: 70,
            n: 9,
            k: 33,
            batch: 2,
            transpose_a: false,
            transpose_b: true,
            lda: 33,
            ldb: 33,
            ldc: 9,
            stride_a: 70 * 33,
            stride_b: 0,
            stride_c: 70 * 9,
            accumulate: out == GemmDType::F32,
        };
        launches.push(gemm::tiled(&gemm).unwrap());
    }
    for bytes in [2, 4, 8] {
        launches.push(copy::strided_copy(addr(0), addr(1), &[2, 3], &[1, 2], bytes).unwrap());
    }

    // Scalar and vector variants of the elementwise kernels.
    for at in [addr, unaligned] {
        for a in [F32, BF16] {
            for b in [F32, BF16] {
                launches.push(elementwise::add(at(0), (at(1), a), (at(2), b), 8, 4));
            }
        }
        launches.push(elementwise::mul_f32(at(0), at(1), at(2), 8, 4));
        launches.push(elementwise::scale_f32(at(0), at(1), 2.0, 8));
        for out in [F32, BF16] {
            for weight in [F32, BF16] {
                let weight = (at(2), weight);
                let norm = norm::rmsnorm_f32((at(0), out), at(1), weight, 3, 8, 1e-6);
                launches.push(norm.unwrap());
                let (residual, weight) = (at(3), (at(4), weight.1));
                let add =
                    norm::add_rmsnorm_f32(at(0), (at(1), out), at(2), residual, weight, 3, 8, 1e-6);
                launches.push(add.unwrap());
            }
            for input in [F32, BF16] {
                let gate_up = ([at(1), at(2)], input);
                launches.push(elementwise::swiglu((at(0), out), gate_up, 8));
                for grad in [F32, BF16] {
                    let outs = ([at(0), at(1)], out);
                    let gate_up = ([at(2), at(3)], input);
                    let launch = elementwise::swiglu_backward(outs, gate_up, (at(4), grad), 8);
                    launches.push(launch);
                }
            }
        }
    }
    // The fused RoPE + KV-cache write of every cache and bias storage.
    let rope_kv_dims = cache::RopeKvDims {
        batch: 2,
        seq: 1,
        q_heads: 4,
        kv_heads: 2,
        capacity: 8,
        head_dim: 16,
    };
    let forms = [(own, None, None), (pool, Some([addr(10), addr(11)]), None)];
    let staged = forms.map(|(rows, biases, _)| (rows, biases, Some([addr(12), addr(13)])));
    for (rows, biases, staged) in forms.into_iter().chain(staged) {
        for stored in [(F32, F32), (F32, BF16), (BF16, BF16), (BF16, F32)] {
            let at = cache::RopeKvWrite {
                q_rot: addr(0),
                k_cache: addr(1),
                v_cache: addr(2),
                q: addr(4),
                k: addr(5),
                v: addr(6),
                rope_positions: addr(7),
                positions: addr(8),
                rows,
                biases,
                staged,
            };
            let dims = (rope_kv_dims, 1e4);
            launches.push(cache::rope_kv_write_f32(at, dims, stored, addr(9)));
        }
    }
    launches
}

#[test]
fn every_builder_launches_a_kernel_of_its_module_with_its_signature() {
    let mut launches = every_launch();
    // The L2 prefetch's launch, which the program adds.
    let side = prefetch::side_kernel(&[(addr(30), 4096), (addr(31), 16)]).unwrap();
    launches.push(Launch::Kernel(side));
    let mut seen = std::collections::BTreeSet::new();
    for launch in &launches {
        let Launch::Kernel(kernel) = launch else {
            panic!("builders return kernels: {launch:?}");
        };
        let kinds = parameter_kinds(kernel.module, kernel.function).unwrap_or_else(|| {
            panic!(
                "`{}` is not an extern \"C\" __global__ function of module `{}`",
                kernel.function, kernel.module
            )
        });
        let args: Vec<Option<&str>> = kernel.args.iter().map(|a| Some(arg_kind(a))).collect();
        assert_eq!(kinds, args, "parameters of {}", kernel.function);
        assert!(kernel.grid.0 >= 1 && kernel.grid.1 >= 1 && kernel.grid.2 >= 1);
        seen.insert(kernel.function);
    }
    // Every kernel of every module is reachable from some builder.
    for (module, source) in SOURCES {
        for piece in expanded(source)
            .split("extern \"C\" __global__ void ")
            .skip(1)
        {
            let name = &piece[..piece.find('(').unwrap()];
            assert!(
                seen.contains(name),
                "{module}::{name} has no builder in this test"
            );
        }
    }
}

#[test]
fn vector_variants_need_alignment_and_whole_vectors() {
    let name = |launch: Launch| match launch {
        Launch::Kernel(kernel) => kernel.function,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        name(elementwise::add(
            addr(0),
            (addr(1), F32),
            (addr(2), F32),
            8,
            4
        )),
        "add_f32_vec4"
    );
    assert_eq!(
        name(elementwise::add(
            addr(0),
            (addr(1), F32),
            (addr(2), F32),
            6,
            3
        )),
        "add_f32"
    );
    let offset = Addr { slot: 1, offset: 8 };
    assert_eq!(
        name(elementwise::add(
            addr(0),
            (offset, F32),
            (addr(2), F32),
            8,
            4
        )),
        "add_f32"
    );
    // A bf16 term's vector is 8 bytes.
    assert_eq!(
        name(elementwise::add(
            addr(0),
            (offset, BF16),
            (offset, BF16),
            8,
            4
        )),
        "add_bf16_bf16_vec4"
    );
    let odd = Addr { slot: 1, offset: 4 };
    assert_eq!(
        name(elementwise::add(addr(0), (odd, BF16), (addr(2), F32), 8, 4)),
        "add_bf16_f32"
    );
}

/// SwiGLU and its backward pick the entry point of their storages by name: `_bf16_in` for
/// bf16 gate and up, `_bf16_grad` for a bf16 incoming gradient, `_bf16_out` for bf16 results,
/// `_vec4` where every pointer is aligned to its vector and the count is whole vectors.
#[test]
fn swiglu_entry_points_follow_their_storages() {
    let name = |launch: Launch| match launch {
        Launch::Kernel(kernel) => kernel.function,
        other => panic!("{other:?}"),
    };
    let suffix = |on: bool, text: &str| if on { text.to_string() } else { String::new() };
    let bf16 = |stored: Stored| stored == Stored::BF16;
    for input in [Stored::F32, Stored::BF16] {
        for out in [Stored::F32, Stored::BF16] {
            for (n, aligned) in [(8, true), (8, false), (6, true)] {
                // The vector form needs 8-byte alignment for bf16, 16 for f32: `unaligned`
                // breaks both.
                let at = if aligned { addr } else { unaligned };
                let vector = n == 8 && aligned;
                let tail = suffix(vector, "_vec4");
                let forward = elementwise::swiglu((at(0), out), ([at(1), at(2)], input), n);
                let want = format!(
                    "swiglu_f32{}{}{tail}",
                    suffix(bf16(input), "_bf16_in"),
                    suffix(bf16(out), "_bf16_out")
                );
                assert_eq!(name(forward), want);
                for grad in [Stored::F32, Stored::BF16] {
                    let backward = elementwise::swiglu_backward(
                        ([at(0), at(1)], out),
                        ([at(2), at(3)], input),
                        (at(4), grad),
                        n,
                    );
                    let want = format!(
                        "swiglu_backward_f32{}{}{}{tail}",
                        suffix(bf16(input), "_bf16_in"),
                        suffix(bf16(grad), "_bf16_grad"),
                        suffix(bf16(out), "_bf16_out")
                    );
                    assert_eq!(name(backward), want);
                }
            }
        }
    }
}

#[test]
fn adamw_moves_four_floats_only_when_aligned_and_whole() {
    let hyper = AdamWHyper {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let with_copy = |grad: Addr, dtype: Stored, copy: Option<Addr>, n: u64| {
        let update = optim::AdamWUpdate {
            grad: (grad, dtype),
            step: unaligned(4),
            lr: unaligned(5),
            copy,
            ..adamw_update(dtype, None, None)
        };
        match optim::adamw(update, n, hyper) {
            Launch::Kernel(kernel) => (kernel.function, kernel.grid.0),
            other => panic!("{other:?}"),
        }
    };
    let launch = |grad: Addr, dtype: Stored, n: u64| with_copy(grad, dtype, None, n);
    let f32 = Stored::F32;
    assert_eq!(launch(addr(3), f32, 12), ("adamw_f32_vec4", 1));
    assert_eq!(launch(addr(3), f32, 10), ("adamw_f32", 1));
    assert_eq!(launch(unaligned(3), f32, 12), ("adamw_f32", 1));
    // A bf16 gradient's vector is 8 bytes.
    let bf16 = Stored::BF16;
    let eight = Addr { slot: 3, offset: 8 };
    assert_eq!(launch(eight, bf16, 12), ("adamw_f32_bf16_grad_vec4", 1));
    assert_eq!(launch(eight, f32, 12), ("adamw_f32", 1));
    assert_eq!(launch(unaligned(3), bf16, 12), ("adamw_f32_bf16_grad", 1));
    assert_eq!(launch(addr(3), bf16, 10), ("adamw_f32_bf16_grad", 1));
    // The bf16 copy's vector is 8 bytes too.
    let copy = |at| with_copy(eight, bf16, Some(at), 12).0;
    assert_eq!(copy(eight), "adamw_f32_bf16_grad_vec4");
    assert_eq!(copy(Addr { slot: 7, offset: 4 }), "adamw_f32_bf16_grad");
    // The grid is capped: each thread loops over many elements.
    assert_eq!(launch(addr(3), f32, 1 << 30).1, 8 * 132);
}

/// An AdamW update of the tensors at slots 0 to 6 and the copy given.
fn adamw_update(dtype: Stored, scale: Option<Addr>, copy: Option<Addr>) -> optim::AdamWUpdate {
    optim::AdamWUpdate {
        param: addr(0),
        m: addr(1),
        v: addr(2),
        grad: (addr(3), dtype),
        step: addr(4),
        lr: addr(5),
        scale,
        copy,
    }
}

#[test]
fn clipping_splits_each_gradient_by_its_size_alone() {
    assert_eq!(optim::clip_partials(1), 1);
    assert_eq!(optim::clip_partials(2048), 1);
    assert_eq!(optim::clip_partials(2049), 2);
    assert_eq!(optim::clip_partials(1 << 30), 256);
    assert_eq!(
        optim::clip_workspace_bytes([1, 2049, 1 << 30]),
        (1 + 2 + 256) * 8
    );
    match optim::clip_grad_norm_partial(addr(0), 5000, addr(1)) {
        Launch::Kernel(kernel) => assert_eq!(kernel.grid.0, 3),
        other => panic!("{other:?}"),
    }
}

/// Every kernel begins with `kiln_grid_dependency_wait()`: kiln launches kernels with
/// programmatic stream serialization, so a kernel without the wait could read its producer's
/// output before it is written, and finish before its predecessor (common.cuh says why). The
/// exceptions read only what no kernel of the program writes before their bodies wait: the
/// skinny linears' main kernels their first weight loads (parameters; linear_common.cuh), each
/// beginning with its outputs and a body that waits before x is read and before anything is
/// written; the cached attention's split kernels the cache rows below the positions
/// (decode.cu), waiting before q is read and before anything but shared memory is written.
#[test]
fn every_kernel_waits_for_its_producers_first() {
    let mut kernels = 0;
    for (module, source) in SOURCES {
        let source = &expanded(source);
        for (at, _) in source.match_indices("extern \"C\" __global__") {
            let body = &source[at + source[at..].find('{').expect("a kernel has a body") + 1..];
            let first = body.trim_start();
            let waits_in_body = matches!(*module, "linear" | "linear_mma" | "linear_mma_portable")
                && first.starts_with("KILN_LINEAR_OUT;")
                && ["kiln_linear_body<", "kiln_mma_body<"]
                    .iter()
                    .any(|call| first[..first.find('}').unwrap()].contains(call));
            let attention_waits_in_body = *module == "decode"
                && first.starts_with("// The body waits once the rows nothing writes are staged.")
                && first[..first.find('}').unwrap()].contains("kiln_cached_attention_split(");
            assert!(
                first.starts_with("kiln_grid_dependency_wait();")
                    || waits_in_body
                    || attention_waits_in_body,
                "module {module}: the kernel at byte {at} does not begin with the wait"
            );
            kernels += 1;
        }
    }
    assert!(kernels >= SOURCES.len(), "found {kernels} kernels");
    // The attention split body: one wait, after the settled rows are staged and before q, the
    // fault word and the partials.
    let (_, decode) = SOURCES.iter().find(|(name, _)| *name == "decode").unwrap();
    let text = &decode[decode.find("void kiln_cached_attention_split(").unwrap()..];
    let text = &text[..text.find("\n}\n").unwrap()];
    let wait = text.find("kiln_grid_dependency_wait();").unwrap();
    assert_eq!(text.matches("kiln_grid_dependency_wait();").count(), 1);
    let settled = text
        .find("kiln_decode_stage_rows(keys, values, k_chunk, v_chunk, 0,")
        .unwrap();
    for after in ["kiln_raise(fault)", "kiln_decode_stage_q(", "partials +"] {
        assert!(
            settled < wait && wait < text.find(after).unwrap(),
            "{after}"
        );
    }
    // The bodies that wait: once after the first step's weight loads (x is staged after it),
    // and again (a no-op then) before the results, for a block whose k range is empty.
    for (body, load, stage) in [
        (
            "kiln_linear_body",
            "kiln_linear_load<UNROLL>(wv, rows, valid, first, lane, vecs);",
            "kiln_linear_stage<",
        ),
        (
            "kiln_mma_body",
            "kiln_mma_load<UNROLL>(wa, wb, ra, rb, valid_a, valid_b, first, t, vecs);",
            "kiln_mma_stage<",
        ),
    ] {
        let source = SOURCES
            .iter()
            .map(|(_, s)| *s)
            .find(|s| s.contains(body))
            .unwrap();
        let text = &source[source.find(&format!("void {body}(")).unwrap()..];
        let text = &text[..text.find("\n}\n").unwrap()];
        let wait = "kiln_linear_wait_once(&waited);";
        let (first_load, first_wait) = (text.find(load).unwrap(), text.find(wait).unwrap());
        assert!(
            first_load < first_wait && first_wait < text.find(stage).unwrap(),
            "{body}"
        );
        assert_eq!(text.matches(wait).count(), 2, "{body}");
        let results = text.rfind(wait).unwrap();
        assert!(
            !text[..results].contains("partial["),
            "{body} writes before its wait"
        );
    }
}

/// The split attention kernel's register bound (decode.cu) is written for the block size its
/// builder launches.
#[test]
fn the_split_kernels_bound_names_the_block_size_it_is_launched_with() {
    let (_, source) = SOURCES.iter().find(|(name, _)| *name == "decode").unwrap();
    let bound = format!("#define KILN_DECODE_BOUNDS __launch_bounds__({BLOCK_THREADS}, 4)");
    assert!(source.contains(&bound), "decode.cu lacks `{bound}`");
}
