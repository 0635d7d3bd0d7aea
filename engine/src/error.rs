//! Errors of kiln-engine: one enum for the crate, its variants grouped by topic (files,
//! tokenizer, sampling, stopping, generation config, generation), each carrying the file, field
//! or parameter at fault so a caller can act on it and a person can read it.

/// What went wrong, with the file, field or parameter at fault.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // --- files ---
    /// A file of the model directory cannot be read as it must be.
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },

    // --- tokenizer ---
    /// The tokenizer cannot be loaded or cannot do what was asked.
    #[error("tokenizer {path}: {reason}")]
    Tokenizer { path: String, reason: String },
    /// A field of `tokenizer_config.json` has the wrong form.
    #[error("{path}: field `{field}`: {reason}")]
    TokenizerConfig {
        path: String,
        field: String,
        reason: String,
    },
    /// The chat template does not parse or does not render.
    #[error("chat template of {path}: {reason}")]
    ChatTemplate { path: String, reason: String },

    // --- sampling ---
    /// A sampling parameter lies outside the range it is defined on.
    #[error("sampling parameter `{parameter}` = {value} is out of range: it must be {valid}")]
    SamplingParameter {
        parameter: &'static str,
        value: f32,
        valid: &'static str,
    },
    /// The logits of a step hold NaN, so no distribution follows from them.
    #[error("logits hold NaN at position {position} (of a vocabulary of {vocab_size})")]
    NanLogit { position: usize, vocab_size: usize },
    /// The logits of a step are empty: a vocabulary needs at least one token.
    #[error("the logits are empty: a vocabulary needs at least one token")]
    EmptyVocabulary,
    /// Every logit is −inf: no token has any probability.
    #[error("every one of the {vocab_size} logits is -inf: no token can be chosen")]
    NoCandidate { vocab_size: usize },
    /// A context token id (prompt or generated) is not in the vocabulary of the logits.
    #[error(
        "context token {token} at position {position} is outside the vocabulary of {vocab_size}"
    )]
    ContextToken {
        token: u32,
        position: usize,
        vocab_size: usize,
    },

    // --- stopping ---
    /// Stop criteria that would end a request before its first token, or at every token.
    #[error("stop criteria: `{field}`: {reason}")]
    StopCriteria { field: &'static str, reason: String },

    // --- generation config ---
    /// `generation_config.json` is not a JSON object.
    #[error("{path}: {reason}")]
    GenerationConfigSyntax { path: String, reason: String },
    /// A field of `generation_config.json` has the wrong type or an out-of-range value.
    #[error("{path}: field `{field}`: {reason}")]
    GenerationConfigField {
        path: String,
        field: &'static str,
        reason: String,
    },

    // --- generation ---
    /// A request that cannot be served as given.
    #[error("bad request: {reason}")]
    Request { reason: String },
    /// Generation failed on the way.
    #[error("generation: {reason}")]
    Generate { reason: String },

    // --- below ---
    #[error(transparent)]
    Frontend(#[from] kiln_frontend::Error),
    #[error(transparent)]
    Planner(#[from] kiln_planner::Error),
    #[error(transparent)]
    Runtime(#[from] kiln_runtime::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
