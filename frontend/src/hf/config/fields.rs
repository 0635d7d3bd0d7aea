//! Typed lookups in a `config.json` object, and the errors they raise: each names the file,
//! the key and the JSON value found.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The keys of one JSON object, read with errors that name the file and the key (with the
/// enclosing object's key as `prefix`, as in `rope_parameters.rope_theta`). A `null` value
/// counts as absent, as transformers treats `None` as "use the default".
pub(super) struct Fields<'a> {
    pub(super) object: &'a Map<String, Value>,
    path: &'a str,
    prefix: &'a str,
}

impl<'a> Fields<'a> {
    /// The top-level object of the file at `path`.
    pub(super) fn new(object: &'a Map<String, Value>, path: &'a str) -> Self {
        Fields {
            object,
            path,
            prefix: "",
        }
    }

    /// An object under key `prefix` (given with its trailing dot).
    pub(super) fn nested<'b>(&self, prefix: &'b str, object: &'b Map<String, Value>) -> Fields<'b>
    where
        'a: 'b,
    {
        Fields {
            object,
            path: self.path,
            prefix,
        }
    }

    pub(super) fn get(&self, key: &str) -> Option<&'a Value> {
        self.object.get(key).filter(|value| !value.is_null())
    }

    pub(super) fn error(&self, key: &str, reason: String) -> Error {
        config_error(self.path, &format!("{}{key}", self.prefix), reason)
    }

    pub(super) fn unsupported(&self, key: &str, value: &str, reason: &str) -> Error {
        let field = format!("{}{key}", self.prefix);
        unsupported(self.path, &field, value.to_string(), reason.to_string())
    }

    fn wrong_type(&self, key: &str, expected: &str, value: &Value) -> Error {
        self.error(key, format!("expected {expected}, found {}", shown(value)))
    }

    pub(super) fn size(&self, key: &str) -> Result<Option<usize>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let size = value.as_u64().and_then(|n| usize::try_from(n).ok());
        size.map(Some)
            .ok_or_else(|| self.wrong_type(key, "a non-negative integer", value))
    }

    pub(super) fn required_size(&self, key: &str) -> Result<usize> {
        self.size(key)?
            .ok_or_else(|| self.error(key, "missing (required)".into()))
    }

    pub(super) fn float(&self, key: &str) -> Result<Option<f64>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let number = value.as_f64();
        number
            .map(Some)
            .ok_or_else(|| self.wrong_type(key, "a number", value))
    }

    pub(super) fn boolean(&self, key: &str) -> Result<Option<bool>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let flag = value.as_bool();
        flag.map(Some)
            .ok_or_else(|| self.wrong_type(key, "true or false", value))
    }

    pub(super) fn string(&self, key: &str) -> Result<Option<&'a str>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let text = value.as_str();
        text.map(Some)
            .ok_or_else(|| self.wrong_type(key, "a string", value))
    }
}

pub(super) fn positive(path: &str, field: &str, value: usize) -> Result<()> {
    if value == 0 {
        return Err(config_error(
            path,
            field,
            "must be at least 1, found 0".into(),
        ));
    }
    Ok(())
}

pub(super) fn config_error(path: &str, field: &str, reason: String) -> Error {
    Error::Config {
        path: path.to_string(),
        field: field.to_string(),
        reason,
    }
}

pub(super) fn unsupported(path: &str, field: &str, value: String, reason: String) -> Error {
    Error::Unsupported {
        path: path.to_string(),
        field: field.to_string(),
        value,
        reason,
    }
}

/// A JSON value as errors show it: its JSON text, cut short when long.
pub(super) fn shown(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(60) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
