//! Decoder-only Transformers (Qwen2 and Llama families), written once against [`Ops`].

mod config;
mod eager;
mod ops;
mod transformer;
mod weights;

pub use config::{Family, ModelConfig};
pub use eager::Eager;
pub use ops::{Ops, Precision};
pub use transformer::{
    causal_lm_loss, forward, hidden_states, last_logits, lm_loss, output_head, shifted_targets,
    IGNORE_INDEX,
};
pub use weights::{
    parameter_shapes, random_parameters, random_weights, random_weights_as, shard_parameter,
    shard_part, shard_weights, sharded_config, LayerWeights, ModelWeights,
};
