//! Which values an index operand (token ids, targets, positions) may hold: the contract of the
//! reference kernels, stated once so every backend can check an index input where it enters
//! and refuse exactly what the CPU reference refuses.

use super::Op;
use crate::TensorType;

/// The slot id of a padding row of a pooled cache op: a batch row that reads and writes no
/// cache row (its attention output is 0), so that a program of B rows runs fewer sequences.
pub const PADDING_SLOT: i64 = -1;

/// The valid values of an index operand: `0..end`, and `ignored` (a value that stands for
/// "no index", such as cross-entropy's `ignore_index`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexRange {
    pub end: i64,
    pub ignored: Option<i64>,
}

impl IndexRange {
    fn below(end: usize) -> IndexRange {
        IndexRange {
            end: i64::try_from(end).unwrap_or(i64::MAX),
            ignored: None,
        }
    }

    /// A slot of a pool of `slots` cache rows, or [`PADDING_SLOT`].
    fn slot_of(slots: usize) -> IndexRange {
        IndexRange {
            ignored: Some(PADDING_SLOT),
            ..IndexRange::below(slots)
        }
    }

    pub fn contains(&self, value: i64) -> bool {
        (0..self.end).contains(&value) || self.ignored == Some(value)
    }
}

impl Op {
    /// The range operand `port` must lie in when it is an index operand of this op, given the
    /// operand types; `None` for every other operand (and for ill-typed operands, which the
    /// type rules refuse).
    pub fn index_range(&self, port: usize, operands: &[TensorType]) -> Option<IndexRange> {
        let dim = |operand: usize, axis: usize| -> Option<usize> {
            operands.get(operand)?.dims().get(axis).copied()
        };
        // Rows `p..p + T` of a cache of `Smax` rows: p in 0..=Smax - T.
        let cache_positions = |rows: usize, cache: usize| {
            let (block, capacity) = (dim(rows, 2)?, dim(cache, 2)?);
            Some(IndexRange::below((capacity + 1).saturating_sub(block)))
        };
        match (self, port) {
            (Op::Embedding, 1) => Some(IndexRange::below(dim(0, 0)?)),
            (Op::EmbeddingBackward { vocab, .. }, 0) => Some(IndexRange::below(*vocab)),
            (Op::CrossEntropy { ignore_index } | Op::CrossEntropyBackward { ignore_index }, 1) => {
                let vocab = *operands.first()?.dims().last()?;
                Some(IndexRange {
                    ignored: Some(*ignore_index),
                    ..IndexRange::below(vocab)
                })
            }
            (
                Op::LinearCrossEntropy { ignore_index }
                | Op::LinearCrossEntropyBackward { ignore_index }
                | Op::LinearCrossEntropyGrad { ignore_index },
                2,
            ) => Some(IndexRange {
                ignored: Some(*ignore_index),
                ..IndexRange::below(dim(1, 0)?)
            }),
            (Op::KvCacheWrite, 2) => cache_positions(1, 0),
            (Op::CachedAttention { .. }, 3) => cache_positions(0, 1),
            // A pooled cache's row (slot) of each batch row, or a padding row.
            (Op::KvCacheWrite, 3) => Some(IndexRange::slot_of(dim(0, 0)?)),
            (Op::CachedAttention { .. }, 4) => Some(IndexRange::slot_of(dim(1, 0)?)),
            (Op::Rope { .. } | Op::RopeBackward { .. }, 1) => Some(IndexRange::below(usize::MAX)),
            // The epilogue's caches and indices: `RopeKvWrite`'s ranges on its views of the
            // linear's results.
            (
                Op::Linear {
                    biases,
                    rope_kv: Some(theta),
                    ..
                },
                _,
            ) => {
                let ports = super::rope_kv::LinearRopeKv::of(biases);
                let rope_port = port.checked_sub(ports.k_cache)? + super::rope_kv::K_CACHE;
                let widths: Vec<usize> = (1..=3).map(|g| dim(g, 0)).collect::<Option<_>>()?;
                let (cache, positions) = (
                    operands.get(ports.k_cache)?,
                    operands.get(ports.rope_positions)?,
                );
                let views =
                    super::rope_kv::LinearRopeKv::views(&widths, cache.dims(), positions.dims())?;
                let mut types = (views.into_iter())
                    .map(|dims| TensorType::new(crate::DType::F32, dims).ok())
                    .collect::<Option<Vec<_>>>()?;
                types.extend_from_slice(&operands[ports.k_cache..]);
                let op = Op::RopeKvWrite {
                    theta: *theta,
                    bias: false,
                    staged: None,
                };
                op.index_range(rope_port, &types)
            }
            (Op::RopeKvWrite { theta, bias, .. }, _) => {
                let parts = super::rope_kv::RopeKvParts::of(*theta, *bias, operands.len())?;
                match parts.indices.iter().position(|&p| p == port) {
                    // The positions of the T new keys (k [B,T,Hkv,D]) in the cache.
                    Some(0) => {
                        let (block, capacity) =
                            (dim(super::rope_kv::K, 1)?, dim(super::rope_kv::K_CACHE, 2)?);
                        Some(IndexRange::below((capacity + 1).saturating_sub(block)))
                    }
                    Some(_) => Some(IndexRange::slot_of(dim(super::rope_kv::K_CACHE, 0)?)),
                    None => (port == super::rope_kv::ROPE_POSITIONS)
                        .then_some(IndexRange::below(usize::MAX)),
                }
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    fn ty(dtype: DType, dims: &[usize]) -> TensorType {
        TensorType::new(dtype, dims).unwrap()
    }

    #[test]
    fn ranges_follow_the_operand_shapes() {
        let f = |dims: &[usize]| ty(DType::F32, dims);
        let ids = ty(DType::I64, &[2, 3]);
        let embedding = Op::Embedding.index_range(1, &[f(&[50, 8]), ids.clone()]);
        assert_eq!(embedding, Some(IndexRange::below(50)));
        assert_eq!(Op::Embedding.index_range(0, &[f(&[50, 8]), ids]), None);

        let loss = Op::CrossEntropy { ignore_index: -100 };
        let range = loss
            .index_range(1, &[f(&[6, 97]), ty(DType::I64, &[6])])
            .unwrap();
        assert!(range.contains(0) && range.contains(96) && range.contains(-100));
        assert!(!range.contains(97) && !range.contains(-1));

        // A cache of 12 rows taking 5 new rows: positions 0..=7.
        let cache = f(&[2, 2, 12, 4]);
        let write = Op::KvCacheWrite.index_range(2, &[cache.clone(), f(&[2, 2, 5, 4])]);
        assert_eq!(write, Some(IndexRange::below(8)));
        let attention = Op::CachedAttention { scale: 0.5 };
        let q = f(&[2, 4, 5, 4]);
        let range = attention.index_range(3, &[q, cache.clone(), cache]);
        assert_eq!(range, Some(IndexRange::below(8)));

        let rope = Op::Rope {
            theta: 1e4,
            bias: false,
        };
        let range = rope.index_range(1, &[f(&[1, 2, 3, 4])]).unwrap();
        assert!(range.contains(i64::MAX - 1) && !range.contains(-1));
    }
}
