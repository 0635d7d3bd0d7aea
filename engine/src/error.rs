//! Errors of kiln-engine.

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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
