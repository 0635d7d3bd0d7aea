//! The ops that read indices besides attention's positions: the embedding gather and its
//! scatter-add backward, and cross-entropy against targets.

use kiln_ir::Op;
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
                let mut launches = vec![gpu::embedding::zero_f32(
                    grad_weight.addr(),
                    size(grad_weight.numel()),
                )];
                if ids.numel() > 0 && hidden > 0 {
                    launches.push(gpu::embedding::embedding_backward_f32(
                        grad_weight.addr(),
                        ids.addr(),
                        grad.addr(),
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
}
