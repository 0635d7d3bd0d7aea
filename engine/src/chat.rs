//! Chat templates: the Jinja template of `tokenizer_config.json` (`chat_template`) rendered with
//! `minijinja` as transformers renders it in `apply_chat_template`: `trim_blocks` and
//! `lstrip_blocks` on, Python's string methods available (`minijinja-contrib`'s pycompat), the
//! context `messages`, `add_generation_prompt`, `bos_token` and `eos_token`, and
//! `raise_exception(message)` failing the render with the template's own message.

use minijinja::{context, Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One message of a conversation (the OpenAI and transformers shape).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A parsed chat template, ready to render.
pub struct ChatTemplate {
    env: Environment<'static>,
    path: String,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// The template of a `tokenizer_config.json` (already parsed, read from `path`): its
    /// `chat_template` string, or from a list of named templates the one named `default`;
    /// `None` when it has none.
    pub fn from_config(path: &str, config: &serde_json::Value) -> Result<Option<ChatTemplate>> {
        let wrong = |reason: &str| Error::TokenizerConfig {
            path: path.to_string(),
            field: NAME.to_string(),
            reason: reason.to_string(),
        };
        let source = match config.get(NAME) {
            None | Some(serde_json::Value::Null) => return Ok(None),
            Some(serde_json::Value::String(source)) => source.clone(),
            Some(serde_json::Value::Array(named)) => {
                let default = named.iter().find(|t| t["name"] == "default");
                match default.and_then(|t| t["template"].as_str()) {
                    Some(source) => source.to_string(),
                    None => return Err(wrong("a list of templates without one named `default`")),
                }
            }
            Some(_) => return Err(wrong("must be a string or a list of named templates")),
        };
        Self::new(path, source).map(Some)
    }

    /// A template from its Jinja `source` (errors name `path`).
    pub fn new(path: &str, source: String) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        let mut syntax = minijinja::syntax::SyntaxConfig::builder();
        syntax.trim_blocks(true).lstrip_blocks(true);
        let syntax = syntax.build().map_err(|e| template_error(path, &e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source)
            .map_err(|e| template_error(path, &e))?;
        Ok(ChatTemplate {
            env,
            path: path.to_string(),
        })
    }

    /// `messages` rendered; with `add_generation_prompt` the template opens the assistant's
    /// turn. `special` are the BOS and EOS tokens' texts.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        (bos_token, eos_token): (Option<&str>, Option<&str>),
    ) -> Result<String> {
        let template = (self.env.get_template(NAME)).map_err(|e| template_error(&self.path, &e))?;
        template
            .render(context! {
                messages => minijinja::value::Serde(messages),
                add_generation_prompt => add_generation_prompt,
                bos_token => bos_token.unwrap_or_default(),
                eos_token => eos_token.unwrap_or_default(),
            })
            .map_err(|e| template_error(&self.path, &e))
    }
}

/// A template error with its kind, line and the template's own message.
fn template_error(path: &str, e: &minijinja::Error) -> Error {
    let line = e
        .line()
        .map(|l| format!(" (template line {l})"))
        .unwrap_or_default();
    let detail = e.detail().map(|d| format!(": {d}")).unwrap_or_default();
    Error::ChatTemplate {
        path: path.to_string(),
        reason: format!("{}{detail}{line}", e.kind()),
    }
}
