//! The tiled GEMM's builder: the instance, grid and arguments of a few descriptors, and each
//! refusal naming the field that is wrong.

use super::*;

fn addr(slot: u32) -> Addr {
    Addr { slot, offset: 0 }
}

/// One dense f32 product `[m,k] · [k,n]`.
fn dense(m: u64, n: u64, k: u64) -> Gemm {
    Gemm {
        dtype: GemmDType::F32,
        out: GemmDType::F32,
        a: addr(0),
        b: addr(1),
        c: addr(2),
        m,
        n,
        k,
        batch: 1,
        transpose_a: false,
        transpose_b: false,
        lda: k,
        ldb: n,
        ldc: n,
        stride_a: m * k,
        stride_b: k * n,
        stride_c: m * n,
        accumulate: false,
    }
}

fn kernel(gemm: &Gemm) -> Kernel {
    match tiled(gemm) {
        Ok(Launch::Kernel(kernel)) => kernel,
        other => panic!("{other:?}"),
    }
}

/// The (op, argument, reason) of a refused descriptor.
fn refusal(gemm: &Gemm) -> (&'static str, &'static str, String) {
    match tiled(gemm) {
        Err(Error::Argument {
            op,
            argument,
            reason,
        }) => (op, argument, reason),
        other => panic!("expected a refusal of {gemm:?}, got {other:?}"),
    }
}

#[test]
fn one_block_of_256_threads_per_output_tile_and_batch() {
    for ((m, n, batch), grid) in [
        ((1, 1, 1), (1, 1, 1)),
        ((64, 64, 1), (1, 1, 1)),
        ((65, 64, 1), (1, 2, 1)),
        ((64, 65, 3), (2, 1, 3)),
        ((2048, 151_936, 2), (2374, 32, 2)),
        ((64 * 65_535, 1, 65_535), (1, 65_535, 65_535)),
    ] {
        let gemm = Gemm {
            batch,
            ..dense(m, n, 7)
        };
        let kernel = kernel(&gemm);
        assert_eq!((kernel.module, kernel.function), ("gemm", "gemm_f32"));
        assert_eq!(kernel.grid, grid, "m {m}, n {n}, batch {batch}");
        assert_eq!(kernel.block, (256, 1, 1));
        assert_eq!((kernel.shared_bytes, kernel.cluster), (0, (1, 1, 1)));
    }
}

#[test]
fn every_field_is_passed_in_the_signature_order() {
    let gemm = Gemm {
        dtype: GemmDType::BF16,
        a: Addr { slot: 4, offset: 6 },
        m: 5,
        n: 7,
        k: 9,
        batch: 2,
        transpose_a: true,
        lda: 6,
        ldb: 8,
        ldc: 10,
        stride_a: 100,
        stride_b: 0,
        stride_c: 120,
        accumulate: true,
        ..dense(5, 7, 9)
    };
    let kernel = kernel(&gemm);
    assert_eq!(kernel.function, "gemm_bf16");
    let sizes = [5, 7, 9, 6, 8, 10, 100, 0, 120].map(Arg::I64);
    let mut expected = vec![Arg::Ptr(addr(2)), Arg::Ptr(gemm.a), Arg::Ptr(addr(1))];
    expected.extend(sizes);
    expected.extend([Arg::I32(1), Arg::I32(0), Arg::I32(1)]);
    assert_eq!(kernel.args, expected);
}

#[test]
fn each_dtype_combination_has_its_instance() {
    let with = |dtype, out| Gemm {
        dtype,
        out,
        ..dense(3, 4, 5)
    };
    let (f32, bf16) = (GemmDType::F32, GemmDType::BF16);
    assert_eq!(kernel(&with(f32, f32)).function, "gemm_f32");
    assert_eq!(kernel(&with(bf16, f32)).function, "gemm_bf16");
    assert_eq!(kernel(&with(bf16, bf16)).function, "gemm_bf16_to_bf16");
    let accumulated = Gemm {
        accumulate: true,
        ..with(bf16, f32)
    };
    assert_eq!(kernel(&accumulated).args[14], Arg::I32(1));
}

#[test]
fn bad_descriptors_are_refused_naming_the_field() {
    let base = Gemm {
        batch: 2,
        ..dense(5, 7, 9)
    };
    let huge = i64::MAX as u64;
    let cases: Vec<(Gemm, (&str, &str), &str)> = vec![
        (dense(0, 7, 9), ("gemm_f32", "m"), "at least 1"),
        (dense(5, 0, 9), ("gemm_f32", "n"), "at least 1"),
        (dense(5, 7, 0), ("gemm_f32", "k"), "at least 1"),
        (
            Gemm {
                batch: 0,
                ..base.clone()
            },
            ("gemm_f32", "batch"),
            "at least 1",
        ),
        (
            Gemm {
                out: GemmDType::BF16,
                ..base.clone()
            },
            ("gemm", "out"),
            "bf16 A and B",
        ),
        (
            Gemm {
                lda: 8,
                ..base.clone()
            },
            ("gemm_f32", "lda"),
            "stored row of `a` (5 x 9)",
        ),
        (
            Gemm {
                transpose_a: true,
                lda: 4,
                ..base.clone()
            },
            ("gemm_f32", "lda"),
            "stored row of `a` (9 x 5)",
        ),
        (
            Gemm {
                ldb: 6,
                ..base.clone()
            },
            ("gemm_f32", "ldb"),
            "(9 x 7)",
        ),
        (
            Gemm {
                transpose_b: true,
                ldb: 8,
                ..base.clone()
            },
            ("gemm_f32", "ldb"),
            "(7 x 9)",
        ),
        (
            Gemm {
                ldc: 6,
                ..base.clone()
            },
            ("gemm_f32", "ldc"),
            "(5 x 7)",
        ),
        (
            Gemm {
                stride_b: huge + 1,
                ..base.clone()
            },
            ("gemm_f32", "stride_b"),
            "signed 64-bit argument",
        ),
        (
            Gemm {
                stride_c: huge,
                ..base.clone()
            },
            ("gemm_f32", "c"),
            "spans more elements",
        ),
        (
            Gemm {
                lda: huge / 2,
                ..base.clone()
            },
            ("gemm_f32", "a"),
            "spans more elements",
        ),
        (
            Gemm {
                b: Addr { slot: 1, offset: 2 },
                ..base.clone()
            },
            ("gemm_f32", "b"),
            "byte offset 2 is not a multiple of its 4-byte elements",
        ),
        (
            Gemm {
                dtype: GemmDType::BF16,
                out: GemmDType::BF16,
                c: Addr { slot: 2, offset: 3 },
                ..base.clone()
            },
            ("gemm_bf16_to_bf16", "c"),
            "2-byte elements",
        ),
        (
            dense(64 * 65_535 + 1, 1, 1),
            ("gemm_f32", "m / 64 (row tiles)"),
            "65536 does not fit a grid dimension of 1..=65535",
        ),
        (
            Gemm {
                batch: 65_536,
                ..base.clone()
            },
            ("gemm_f32", "batch"),
            "65536 does not fit",
        ),
    ];
    for (gemm, (op, argument), reason) in cases {
        let (got_op, got_argument, got_reason) = refusal(&gemm);
        assert_eq!((got_op, got_argument), (op, argument), "{got_reason}");
        assert!(got_reason.contains(reason), "{argument}: {got_reason}");
    }
    // The message as a user reads it.
    let message = tiled(&Gemm {
        ldc: 6,
        ..base.clone()
    })
    .unwrap_err()
    .to_string();
    assert_eq!(
        message,
        "gemm_f32: argument `ldc` is invalid: 6 is shorter than a stored row of `c` (5 x 7)"
    );
    // bf16 elements need only 2-byte alignment; transposed operands their transposed rows.
    let aligned = Gemm {
        dtype: GemmDType::BF16,
        a: Addr { slot: 0, offset: 2 },
        transpose_a: true,
        lda: 5,
        transpose_b: true,
        ldb: 9,
        ..base
    };
    assert_eq!(kernel(&aligned).function, "gemm_bf16");
}

/// A descriptor's extents run from each address through its last batch's last row.
#[test]
fn spans_reach_the_last_row_of_the_last_batch() {
    let mut gemm = dense(3, 5, 7);
    assert_eq!(gemm.spans(), [3 * 7 * 4, 7 * 5 * 4, 3 * 5 * 4]);
    // B transposed ([n,k], ld 8), three batches of C with a gap, bf16 in and out.
    gemm = Gemm {
        dtype: GemmDType::BF16,
        out: GemmDType::BF16,
        transpose_b: true,
        ldb: 8,
        batch: 3,
        stride_c: 20,
        ..gemm
    };
    let b = (2 * 7 * 5 + 4 * 8 + 7) * 2;
    let c = (2 * 20 + 2 * 5 + 5) * 2;
    assert_eq!(gemm.spans(), [(2 * 21 + 2 * 7 + 7) * 2, b, c]);
    assert_eq!(Gemm { batch: 0, ..gemm }.spans(), [0; 3]);
}
