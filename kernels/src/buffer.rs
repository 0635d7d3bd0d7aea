//! Owned host elements of one dtype: what a CPU storage holds and what views borrow from.

use half::{bf16, f16};
use kiln_ir::DType;

use crate::element::Element;
use crate::view::{Data, DataMut};

/// Owned host elements of one dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum Buffer {
    F32(Vec<f32>),
    F64(Vec<f64>),
    BF16(Vec<bf16>),
    F16(Vec<f16>),
    I32(Vec<i32>),
    I64(Vec<i64>),
}

impl Buffer {
    /// `len` zeros of `dtype`.
    pub fn zeros(dtype: DType, len: usize) -> Self {
        match dtype {
            DType::F32 => Buffer::F32(vec![0.0; len]),
            DType::F64 => Buffer::F64(vec![0.0; len]),
            DType::BF16 => Buffer::BF16(vec![bf16::ZERO; len]),
            DType::F16 => Buffer::F16(vec![f16::ZERO; len]),
            DType::I32 => Buffer::I32(vec![0; len]),
            DType::I64 => Buffer::I64(vec![0; len]),
        }
    }

    /// Takes ownership of typed elements (no copy).
    pub fn from_vec<T: Element>(values: Vec<T>) -> Self {
        T::into_buffer(values)
    }

    pub fn data(&self) -> Data<'_> {
        match self {
            Buffer::F32(v) => Data::F32(v),
            Buffer::F64(v) => Data::F64(v),
            Buffer::BF16(v) => Data::BF16(v),
            Buffer::F16(v) => Data::F16(v),
            Buffer::I32(v) => Data::I32(v),
            Buffer::I64(v) => Data::I64(v),
        }
    }

    pub fn data_mut(&mut self) -> DataMut<'_> {
        match self {
            Buffer::F32(v) => DataMut::F32(v),
            Buffer::F64(v) => DataMut::F64(v),
            Buffer::BF16(v) => DataMut::BF16(v),
            Buffer::F16(v) => DataMut::F16(v),
            Buffer::I32(v) => DataMut::I32(v),
            Buffer::I64(v) => DataMut::I64(v),
        }
    }

    pub fn dtype(&self) -> DType {
        self.data().dtype()
    }

    pub fn len(&self) -> usize {
        self.data().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address of the first element (stable while the buffer is not resized).
    pub fn address(&self) -> usize {
        match self {
            Buffer::F32(v) => v.as_ptr() as usize,
            Buffer::F64(v) => v.as_ptr() as usize,
            Buffer::BF16(v) => v.as_ptr() as usize,
            Buffer::F16(v) => v.as_ptr() as usize,
            Buffer::I32(v) => v.as_ptr() as usize,
            Buffer::I64(v) => v.as_ptr() as usize,
        }
    }
}
