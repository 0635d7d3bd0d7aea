//! The ops that read indices besides attention's positions: the embedding gather and its
//! scatter-add backward, cross-entropy against targets, and the chunked LM-head loss.

use kiln_ir::{DType, Op};
use kiln_kernels::gpu::{self, Launch};

use super::{size, two_dims, Lowering, F32, I64};
use crate::error::Result;

impl Lowering<'_> {
    pub(super) fn embedding(&self) -> Result<Vec<Launch>> {
        match self.op {
            Op::Embedding => {
                let (weight, stored) = self.stored(0, "weight")?;
                let ids = self.operand(1, "ids", I64)?;
                let out = self.result(0, "out", F32)?;
                let [vocab, hidden] = two_dims(self, weight, "weight")?;
                let launch = gpu::embedding::embedding_f32(
                    out.addr(),
                    (weight.addr(), stored),
                    ids.addr(),
                    [size(ids.numel()), hidden, vocab],
                    self.fault,
                )?;
                Ok(vec![launch])
            }
            _ => {
                let ids = self.operand(0, "ids", I64)?;
                let grad = self.operand(1, "grad", F32)?;
                let grad_weight = self.result(0, "grad_weight", F32)?;
                let [vocab, hidden] = two_dims(self, grad_weight, "grad_weight")?;
                let base = match self.op {
                    Op::EmbeddingBackward { onto: true, .. } => {
                        let (base, stored) = self.stored(2, "base")?;
                        Some((base.addr(), stored))
                    }
                    _ => None,
                };
                let n = size(grad_weight.numel());
                let mut launches = vec![match base {
                    Some(base) => gpu::embedding::embedding_base_f32(grad_weight.addr(), base, n),
                    None => gpu::embedding::zero_f32(grad_weight.addr(), n),
                }];
                if ids.numel() > 0 && hidden > 0 {
                    launches.push(gpu::embedding::embedding_backward_f32(
                        grad_weight.addr(),
                        ids.addr(),
                        grad.addr(),
                        base,
                        [size(ids.numel()), hidden, vocab],
                        self.fault,
                    )?);
                }
                Ok(launches)
            }
        }
    }

    pub(super) fn cross_entropy(&self) -> Result<Vec<Launch>> {
        let logits = self.operand(0, "logits", F32)?;
        let targets = self.operand(1, "targets", I64)?;
        let sizes @ [rows, _] = two_dims(self, logits, "logits")?;
        match self.op {
            Op::CrossEntropy { ignore_index } => {
                let loss = self.result(0, "loss", F32)?;
                let row_loss = self.workspace(rows * 4, loss.addr())?;
                let mut launches = Vec::new();
                if rows > 0 {
                    launches.push(gpu::loss::cross_entropy_rows_f32(
                        row_loss,
                        logits.addr(),
                        targets.addr(),
                        (sizes, *ignore_index),
                        self.fault,
                    )?);
                }
                launches.push(gpu::loss::cross_entropy_mean_f32(
                    loss.addr(),
                    row_loss,
                    targets.addr(),
                    rows,
                    *ignore_index,
                ));
                Ok(launches)
            }
            Op::CrossEntropyBackward { ignore_index } => {
                let grad_loss = self.operand(2, "grad_loss", F32)?;
                let grad = self.result(0, "grad_logits", F32)?;
                let inputs = [logits.addr(), targets.addr(), grad_loss.addr()];
                Ok(vec![gpu::loss::cross_entropy_backward_f32(
                    grad.addr(),
                    inputs,
                    (sizes, *ignore_index),
                    self.fault,
                )?])
            }
            _ => unreachable!("cross_entropy lowers only the cross-entropy ops"),
        }
    }

    /// The chunked LM-head loss, its backward, and both in one ([`gpu::loss::LinearLoss`]).
    pub(super) fn linear_cross_entropy(&self) -> Result<Vec<Launch>> {
        let x = self.operand(0, "x", self.i.first().map_or(F32, |x| x.dtype))?;
        self.expect_dtype(x, "x", &[F32, DType::BF16])?;
        let weight = self.operand(1, "weight", x.dtype)?;
        let targets = self.operand(2, "targets", I64)?;
        let [rows, hidden] = two_dims(self, x, "x")?;
        let [vocab, _] = two_dims(self, weight, "weight")?;
        let dtype = gpu::GemmDType::of(x.dtype).expect("dtype checked above");
        let (Op::LinearCrossEntropy { ignore_index }
        | Op::LinearCrossEntropyBackward { ignore_index }
        | Op::LinearCrossEntropyGrad { ignore_index }) = self.op
        else {
            unreachable!("linear_cross_entropy lowers only the chunked loss ops")
        };
        let loss = gpu::loss::LinearLoss::new([rows, hidden, vocab], dtype, *ignore_index);
        match self.op {
            Op::LinearCrossEntropy { .. } => {
                let io = gpu::loss::LinearLossForward {
                    x: x.addr(),
                    weight: weight.addr(),
                    targets: targets.addr(),
                    loss: self.result(0, "loss", F32)?.addr(),
                    lse: self.result(1, "lse", F32)?.addr(),
                };
                let workspace = self.workspace(loss.forward_workspace_bytes(), io.loss)?;
                Ok(loss.forward(&io, workspace, self.fault)?)
            }
            Op::LinearCrossEntropyGrad { .. } => {
                let io = gpu::loss::LinearLossGrad {
                    x: x.addr(),
                    weight: weight.addr(),
                    targets: targets.addr(),
                    grad_loss: self.operand(3, "grad_loss", F32)?.addr(),
                    loss: self.result(0, "loss", F32)?.addr(),
                    grad_x: self.result(1, "grad_x", x.dtype)?.addr(),
                    grad_weight: self.result(2, "grad_weight", x.dtype)?.addr(),
                };
                let workspace = self.workspace(loss.fused_workspace_bytes(), io.loss)?;
                Ok(loss.fused(&io, workspace, self.fault)?)
            }
            _ => {
                let io = gpu::loss::LinearLossBackward {
                    x: x.addr(),
                    weight: weight.addr(),
                    targets: targets.addr(),
                    lse: self.operand(3, "lse", F32)?.addr(),
                    grad_loss: self.operand(4, "grad_loss", F32)?.addr(),
                    grad_x: self.result(0, "grad_x", x.dtype)?.addr(),
                    grad_weight: self.result(1, "grad_weight", x.dtype)?.addr(),
                };
                let workspace = self.workspace(loss.backward_workspace_bytes(), io.grad_x)?;
                Ok(loss.backward(&io, workspace, self.fault)?)
            }
        }
    }
}
