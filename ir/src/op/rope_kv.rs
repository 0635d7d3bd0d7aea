//! The unfused ops a fused [`Op::RopeKvWrite`] stands for, by operand port: the one
//! description its type rule, the CPU reference and the fusion rule share.

use super::Op;

/// Ports of `RopeKvWrite`'s operands (see the op's doc for their order).
pub const Q: usize = 0;
pub const K: usize = 1;
pub const V: usize = 2;
pub const K_CACHE: usize = 3;
pub const V_CACHE: usize = 4;
pub const ROPE_POSITIONS: usize = 5;
pub const POSITIONS: usize = 6;

/// Ports of the staged form's results beyond `(q_rot, k_cache, v_cache)`: the rotated keys and
/// the head-major values, each rounded as `q_rot` is.
pub const K_ROT: usize = 3;
pub const V_ROWS: usize = 4;

/// Where the operands of each unfused op come from.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeKvParts {
    /// `Rope{theta, bias}`, applied to q and to k.
    pub rope: Op,
    /// Operands of the query's `Rope`: q, the rope positions[, q_bias].
    pub q_rope: Vec<usize>,
    /// Operands of the keys' `Rope`: k, the rope positions[, k_bias].
    pub k_rope: Vec<usize>,
    /// The cache writes' indices: positions[, rows]. The k write takes (k_cache, the rotated
    /// keys, indices…), the v write (v_cache, v, indices…).
    pub indices: Vec<usize>,
}

impl RopeKvParts {
    /// The parts of `RopeKvWrite{theta, bias}` with `operands` operands, or `None` when that
    /// is not one of its arities (7 or 8 (pooled), plus 2 with the biases).
    pub fn of(theta: f64, bias: bool, operands: usize) -> Option<RopeKvParts> {
        let biases = if bias { 2 } else { 0 };
        let pooled = match operands.checked_sub(biases)? {
            7 => false,
            8 => true,
            _ => return None,
        };
        let indices: Vec<usize> = (POSITIONS..=POSITIONS + usize::from(pooled)).collect();
        let first_bias = POSITIONS + indices.len();
        let with_bias = |x: usize, port: usize| {
            let mut ports = vec![x, ROPE_POSITIONS];
            ports.extend(bias.then_some(port));
            ports
        };
        Some(RopeKvParts {
            rope: Op::Rope { theta, bias },
            q_rope: with_bias(Q, first_bias),
            k_rope: with_bias(K, first_bias + 1),
            indices,
        })
    }

    /// The operand count `RopeKvWrite{bias}` takes, pooled or not.
    pub fn arity(bias: bool, pooled: bool) -> usize {
        7 + usize::from(pooled) + if bias { 2 } else { 0 }
    }
}

/// Ports of a fused `Linear` with `rope_kv` (see the op's doc): after x, the three weights and
/// the biases come the caches, the rope positions, the positions and (pooled) the rows, in
/// `RopeKvWrite`'s order from [`K_CACHE`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearRopeKv {
    pub k_cache: usize,
    pub v_cache: usize,
    pub rope_positions: usize,
    pub positions: usize,
    /// The pooled form's rows (an operand only when the op has `rows + 1` operands).
    pub rows: usize,
}

impl LinearRopeKv {
    /// The ports of a `Linear{biases, rope_kv: Some(_)}`.
    pub fn of(biases: &[bool]) -> LinearRopeKv {
        let k_cache = 1 + biases.len() + biases.iter().filter(|&&b| b).count();
        LinearRopeKv {
            k_cache,
            v_cache: k_cache + 1,
            rope_positions: k_cache + 2,
            positions: k_cache + 3,
            rows: k_cache + 4,
        }
    }

    /// The views `RopeKvWrite` takes of the op's results `y_g [M, widths[g]]` as its q, k and
    /// v: `[B,T,Hq,D]`, `[B,T,Hkv,D]` and `[B,Hkv,T,D]`, with B and T the rope positions'
    /// (`[B,T]`) and D the k cache's head size (`[S,Hkv,Smax,D]`); `None` where those are not
    /// of that rank, D is 0 or a width is no whole number of heads (at least one).
    pub fn views(
        widths: &[usize],
        k_cache: &[usize],
        rope_positions: &[usize],
    ) -> Option<[Vec<usize>; 3]> {
        let (&[_, _, _, d], &[b, t], &[nq, nk, nv]) = (k_cache, rope_positions, widths) else {
            return None;
        };
        let heads = |n: usize| (d > 0 && n > 0 && n.is_multiple_of(d)).then(|| n / d);
        let (hq, hk, hv) = (heads(nq)?, heads(nk)?, heads(nv)?);
        Some([vec![b, t, hq, d], vec![b, t, hk, d], vec![b, hv, t, d]])
    }
}
