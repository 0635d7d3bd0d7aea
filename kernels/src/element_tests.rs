//! Tests of `Element::from_f64` for bf16 and f16: one rounding to nearest, ties to even (checked
//! against the neighbours of each result and against `half`'s f32 conversions), values just
//! above a tie, overflow and special values; and of the round-to-odd step beneath it.

use half::{bf16, f16};
use rand::Rng;

use super::*;
use crate::testing;

fn bf16_of(x: f64) -> bf16 {
    <bf16 as Element>::from_f64(x)
}

fn f16_of(x: f64) -> f16 {
    <f16 as Element>::from_f64(x)
}

/// Whether `r` (bits `r_bits`) is `x` rounded to nearest, ties to even, among its neighbours.
fn is_nearest_even(x: f64, r: f64, r_bits: u16, neighbours: [f64; 2]) -> bool {
    let distance = (x - r).abs(); // exact: r is within a factor 2 of x (Sterbenz)
    neighbours.iter().all(|&n| {
        let other = (x - n).abs();
        distance < other || (distance == other && r_bits & 1 == 0)
    })
}

#[test]
fn from_f64_rounds_just_above_a_tie_up() {
    // The excess lies below f64's upper 32 mantissa bits, which `half`'s `from_f64` drops.
    let above = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    assert_eq!(bf16_of(above).to_f64(), 1.0 + 2f64.powi(-7));
    assert_eq!(bf16_of(-above).to_f64(), -(1.0 + 2f64.powi(-7)));
    let above = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
    assert_eq!(f16_of(above).to_f64(), 1.0 + 2f64.powi(-10));
    // An f32 just above a tie (1 + 2^-8 + 2^-23, exact in f64).
    let above = (1.0f32 + 2f32.powi(-8) + 2f32.powi(-23)) as f64;
    assert_eq!(bf16_of(above).to_f64(), 1.0 + 2f64.powi(-7));
    let above = (1.0f32 + 2f32.powi(-11) + 2f32.powi(-23)) as f64;
    assert_eq!(f16_of(above).to_f64(), 1.0 + 2f64.powi(-10));
    // Just below a tie rounds down; an exact tie goes to even.
    let below = 1.0 + 2f64.powi(-8) - 2f64.powi(-40);
    assert_eq!(bf16_of(below).to_f64(), 1.0);
    assert_eq!(bf16_of(1.0 + 2f64.powi(-8)).to_f64(), 1.0);
    assert_eq!(
        bf16_of(1.0 + 3.0 * 2f64.powi(-8)).to_f64(),
        1.0 + 2f64.powi(-6)
    );
    assert_eq!(f16_of(1.0 + 2f64.powi(-11)).to_f64(), 1.0);
}

#[test]
fn from_f64_rounds_once_to_nearest_even() {
    let mut rng = testing::rng("from_f64_rounds_once_to_nearest_even");
    for _ in 0..20_000 {
        let mantissa = rng.random_range(1.0..2.0f64);
        let sign = if rng.random::<bool>() { -1.0 } else { 1.0 };
        let x = sign * mantissa * 2f64.powi(rng.random_range(-100..100));
        let b = bf16_of(x);
        let near = [
            bf16::from_bits(b.to_bits() - 1),
            bf16::from_bits(b.to_bits() + 1),
        ];
        assert!(
            is_nearest_even(x, b.to_f64(), b.to_bits(), near.map(|n| n.to_f64())),
            "bf16 of {x:e}"
        );
        let y = sign * mantissa * 2f64.powi(rng.random_range(-13..15));
        let h = f16_of(y);
        let near = [
            f16::from_bits(h.to_bits() - 1),
            f16::from_bits(h.to_bits() + 1),
        ];
        assert!(
            is_nearest_even(y, h.to_f64(), h.to_bits(), near.map(|n| n.to_f64())),
            "f16 of {y:e}"
        );
    }
}

/// Every f32 is exact in f64, so `from_f64` of it must agree with `half`'s (single-rounding)
/// f32 conversions, over all exponents, subnormals, infinities and NaN included.
#[test]
fn from_f64_of_an_f32_matches_half_from_f32() {
    let mut rng = testing::rng("from_f64_of_an_f32_matches_half_from_f32");
    for _ in 0..100_000 {
        let x = f32::from_bits(rng.random());
        let (b, h) = (bf16_of(x as f64), f16_of(x as f64));
        if x.is_nan() {
            assert!(b.is_nan() && h.is_nan(), "{x:e}");
        } else {
            assert_eq!(b.to_bits(), bf16::from_f32(x).to_bits(), "bf16 of {x:e}");
            assert_eq!(h.to_bits(), f16::from_f32(x).to_bits(), "f16 of {x:e}");
        }
    }
}

#[test]
fn from_f64_overflow_underflow_and_special_values() {
    for x in [1e300, f64::MAX, f64::INFINITY, f32::MAX as f64] {
        assert_eq!(bf16_of(x), bf16::INFINITY, "{x:e}");
        assert_eq!(bf16_of(-x), bf16::NEG_INFINITY, "{x:e}");
        assert_eq!(f16_of(x), f16::INFINITY, "{x:e}");
    }
    // f16's largest value is 65504; 65520 is the tie with 65536 and goes to (even) infinity.
    assert_eq!(f16_of(65520.0 - 2f64.powi(-30)).to_f64(), 65504.0);
    assert_eq!(f16_of(65520.0), f16::INFINITY);
    assert_eq!(bf16_of(bf16::MAX.to_f64()), bf16::MAX);
    // Below f32's smallest subnormal: zero with the sign kept.
    assert_eq!(bf16_of(1e-300).to_bits(), 0);
    assert_eq!(bf16_of(-1e-300).to_bits(), bf16::NEG_ZERO.to_bits());
    assert_eq!(f16_of(-0.0).to_bits(), f16::NEG_ZERO.to_bits());
    // Subnormals: f16's smallest is 2^-24; just above half of it rounds up, half of it to even 0.
    assert_eq!(
        f16_of(2f64.powi(-25) + 2f64.powi(-60)).to_f64(),
        2f64.powi(-24)
    );
    assert_eq!(f16_of(2f64.powi(-25)).to_f64(), 0.0);
    // bf16's smallest subnormal is 2^-133.
    assert_eq!(
        bf16_of(2f64.powi(-134) + 2f64.powi(-170)).to_f64(),
        2f64.powi(-133)
    );
    assert_eq!(bf16_of(2f64.powi(-134)).to_f64(), 0.0);
    assert!(bf16_of(f64::NAN).is_nan());
    assert!(f16_of(f64::NAN).is_nan());
}

#[test]
fn round_to_odd_truncates_and_marks_inexact() {
    assert_eq!(f64_to_f32_round_to_odd(1.5), 1.5);
    let just_above_one = 1.0 + 2f64.powi(-40);
    assert_eq!(
        f64_to_f32_round_to_odd(just_above_one).to_bits(),
        1.0f32.to_bits() | 1
    );
    assert_eq!(
        f64_to_f32_round_to_odd(-just_above_one).to_bits(),
        (-1.0f32).to_bits() | 1
    );
    // Just below 2 (which `as` rounds up to): truncated to below 2, odd.
    let just_below_two = 2.0 - 2f64.powi(-40);
    assert_eq!(
        f64_to_f32_round_to_odd(just_below_two).to_bits(),
        (2.0f32).to_bits() - 1
    );
    assert_eq!(
        f64_to_f32_round_to_odd(1e300),
        f32::MAX,
        "beyond f32 stays finite and odd"
    );
    assert_eq!(f64_to_f32_round_to_odd(f64::INFINITY), f32::INFINITY);
    assert_eq!(
        f64_to_f32_round_to_odd(f64::NEG_INFINITY),
        f32::NEG_INFINITY
    );
    assert!(f64_to_f32_round_to_odd(f64::NAN).is_nan());
}
