//! Element types.

use std::fmt;

/// The element type of a tensor.
///
/// `F64` exists for gradient checks against finite differences; models compute in `F32` or
/// with `BF16`/`F16` GEMM inputs. Integer types carry token ids and positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F64,
    BF16,
    F16,
    I32,
    I64,
}

impl DType {
    /// Every dtype, in a fixed order (for tests and error messages).
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I64,
    ];

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 | DType::I64 => 8,
            DType::BF16 | DType::F16 => 2,
        }
    }

    /// Whether the dtype holds floating-point numbers.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }

    /// The short lowercase name used in IR text, dumps and safetensors (`f32`, `bf16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
