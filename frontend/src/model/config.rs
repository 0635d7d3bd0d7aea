//! Model hyper-parameters (the subset of a Hugging Face config.json kiln implements).

/// Which Hugging Face architecture a config describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `model_type: "qwen2"`: q/k/v biases, no o_proj bias.
    Qwen2,
    /// `model_type: "llama"`: biases as `attention_bias` / `mlp_bias` say.
    Llama,
}

/// The shapes and constants of a decoder-only Transformer.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub family: Family,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias.
    pub qkv_bias: bool,
    /// o_proj carries a bias.
    pub o_bias: bool,
    /// gate/up/down projections carry a bias.
    pub mlp_bias: bool,
    pub max_position_embeddings: usize,
}

impl ModelConfig {
    /// A tiny Qwen2-style model (GQA 4:2, q/k/v biases, untied head) that runs in
    /// milliseconds: kiln's embedded default.
    pub fn tiny() -> Self {
        ModelConfig {
            family: Family::Qwen2,
            hidden_size: 64,
            intermediate_size: 112,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            vocab_size: 97,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            tie_word_embeddings: false,
            qkv_bias: true,
            o_bias: false,
            mlp_bias: false,
            max_position_embeddings: 128,
        }
    }

    /// A tiny Llama-style model (multi-head attention, tied embeddings, no biases): the other
    /// family's small test model.
    pub fn tiny_llama() -> Self {
        ModelConfig {
            family: Family::Llama,
            hidden_size: 48,
            intermediate_size: 80,
            num_hidden_layers: 2,
            num_attention_heads: 3,
            num_key_value_heads: 3,
            head_dim: 16,
            vocab_size: 71,
            rms_norm_eps: 1e-5,
            rope_theta: 500000.0,
            tie_word_embeddings: true,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            max_position_embeddings: 64,
        }
    }

    /// The integer sizes with their config.json names, in a fixed order.
    pub fn sizes(&self) -> [(&'static str, usize); 8] {
        [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ]
    }

    /// Query heads per key/value head.
    pub fn group_size(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads.max(1)
    }

    /// The model one rank of a `ranks`-way tensor-parallel group computes (Megatron's split):
    /// `1/ranks` of the query and key/value heads (so each rank keeps whole GQA groups and its
    /// own KV cache heads) and of the MLP's intermediate columns; embeddings, norms and the
    /// head whole. The projections into heads and gate/up are split by rows (column-parallel),
    /// o_proj and down_proj by columns (row-parallel): each rank's o_proj and down_proj give a
    /// partial sum that an all-reduce completes ([`shard_parameter`](crate::model::shard_parameter)
    /// cuts the weights). `reason` says why a model cannot be split so.
    pub fn shard(&self, ranks: usize) -> std::result::Result<ModelConfig, String> {
        if ranks == 0 {
            return Err("must be at least 1".to_string());
        }
        for (name, count) in [
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("intermediate_size", self.intermediate_size),
        ] {
            if count % ranks != 0 {
                return Err(format!(
                    "the model's {name} ({count}) does not split evenly over {ranks} ranks"
                ));
            }
        }
        if self.o_bias || self.mlp_bias {
            // A row-parallel bias must be added once, after the sum, not by every rank.
            return Err(
                "o_proj and MLP biases are not split (the model has attention_bias or \
                        mlp_bias)"
                    .to_string(),
            );
        }
        Ok(ModelConfig {
            num_attention_heads: self.num_attention_heads / ranks,
            num_key_value_heads: self.num_key_value_heads / ranks,
            intermediate_size: self.intermediate_size / ranks,
            ..self.clone()
        })
    }
}
