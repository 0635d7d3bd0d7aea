//! Value tracing: intermediate values of a run, picked by the names the model code gives them
//! (`layers.0.attn.out`, see `model::transformer`), returned beside the program's outputs.
//!
//! A traced program is the untraced one with an extra output `trace.<name>` per picked value:
//! no op is added or changed, so every other output is computed exactly as before. The eager
//! oracle is traced by [`Probe`], which records the same names as the model code runs.
//!
//! Patterns are globs over whole names: `*` matches any run of characters (dots included),
//! `?` one character. A pattern that matches no name is an error that lists names there are.

use kiln_ir::{Graph, ValueId};

use crate::error::{Error, Result};

mod probe;

pub use probe::Probe;

/// What `kiln eval --trace` writes before a traced value's name.
pub const TRACE_PREFIX: &str = "trace.";

/// How many names an error lists before it says how many more there are.
const LISTED: usize = 12;

/// Checked `--trace` patterns, in the order given (each flag may hold a comma list).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TracePatterns {
    patterns: Vec<String>,
}

impl TracePatterns {
    /// The patterns of `flags`, each split at commas; an empty pattern is an error.
    pub fn parse<S: AsRef<str>>(flags: &[S]) -> Result<Self> {
        let mut patterns = Vec::new();
        for flag in flags {
            for pattern in flag.as_ref().split(',') {
                let pattern = pattern.trim();
                if pattern.is_empty() {
                    return Err(Error::Trace {
                        pattern: format!("{:?}", flag.as_ref()),
                        reason: "empty pattern (expected a value name or a glob such as \
                                 `layers.*.attn.out`)"
                            .into(),
                    });
                }
                patterns.push(pattern.to_string());
            }
        }
        Ok(TracePatterns { patterns })
    }

    /// Whether nothing is traced.
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether some pattern matches `name`.
    pub fn matches(&self, name: &str) -> bool {
        self.patterns.iter().any(|p| glob_match(p, name))
    }

    /// The names of `available` that some pattern matches, in `available`'s order, each once;
    /// an error for the first pattern that matches none of them.
    pub fn select<'n>(&self, available: &[&'n str]) -> Result<Vec<&'n str>> {
        for pattern in &self.patterns {
            if !available.iter().any(|name| glob_match(pattern, name)) {
                return Err(Error::Trace {
                    pattern: pattern.clone(),
                    reason: format!("matches no value name; {}", listing(available)),
                });
            }
        }
        Ok(available
            .iter()
            .copied()
            .filter(|name| self.matches(name))
            .collect())
    }
}

/// "names are: a, b, ... (and N more)".
fn listing(available: &[&str]) -> String {
    if available.is_empty() {
        return "the program names no values".into();
    }
    let shown: Vec<&str> = available.iter().copied().take(LISTED).collect();
    let more = available.len() - shown.len();
    let tail = match more {
        0 => String::new(),
        n => format!(", … ({n} more; `--trace list` prints them all)"),
    };
    format!("names are: {}{tail}", shown.join(", "))
}

/// Whether the glob `pattern` (`*`, `?`, other characters literal) matches all of `name`.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let (pattern, name): (Vec<char>, Vec<char>) =
        (pattern.chars().collect(), name.chars().collect());
    // Greedy matching with one backtrack point: the last `*` and where its match ends.
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(&c) if c == '?' || c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                // Let the last `*` take one more character and retry after it.
                Some((star_p, star_n)) => {
                    star = Some((star_p, star_n + 1));
                    p = star_p + 1;
                    n = star_n + 1;
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// Adds an output `trace.<name>` to `graph` for every named value `patterns` select; returns
/// the output names in the graph's naming order. Nothing else of the graph changes.
pub fn add_trace_outputs(graph: &mut Graph, patterns: &TracePatterns) -> Result<Vec<String>> {
    let named: Vec<(String, ValueId)> = graph.value_names().to_vec();
    let names: Vec<&str> = named.iter().map(|(n, _)| n.as_str()).collect();
    let selected = patterns.select(&names)?;
    let mut outputs = Vec::new();
    for (name, value) in named.iter().filter(|(n, _)| selected.contains(&n.as_str())) {
        let output = format!("{TRACE_PREFIX}{name}");
        graph.output(&output, *value)?;
        outputs.push(output);
    }
    Ok(outputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names() {
        assert!(glob_match("layers.*.attn.out", "layers.0.attn.out"));
        assert!(glob_match("layers.*.attn.out", "layers.12.attn.out"));
        assert!(!glob_match("layers.*.attn.out", "layers.0.attn.outer"));
        assert!(glob_match("layers.?.mlp.*", "layers.3.mlp.norm"));
        assert!(!glob_match("layers.?.mlp.*", "layers.13.mlp.norm"));
        assert!(glob_match("*", "logits"));
        assert!(glob_match("*s", "logits"));
        assert!(glob_match("l*g*s", "logits"));
        assert!(!glob_match("logit", "logits"));
        assert!(glob_match("", ""));
        assert!(!glob_match("", "x"));
        assert!(glob_match("**a**", "a"));
    }

    #[test]
    fn patterns_split_at_commas_and_reject_empty_ones() {
        let patterns = TracePatterns::parse(&["logits, norm", "embed"]).unwrap();
        assert_eq!(patterns.patterns, ["logits", "norm", "embed"]);
        let error = TracePatterns::parse(&["logits,,norm"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("empty pattern"), "{error}");
        assert!(TracePatterns::parse::<&str>(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_pattern_matching_nothing_names_itself_and_what_exists() {
        let patterns = TracePatterns::parse(&["norm", "layers.*.attn.output"]).unwrap();
        let available = ["embed", "layers.0.attn.out", "norm"];
        let error = patterns.select(&available).unwrap_err().to_string();
        assert!(
            error.starts_with("--trace layers.*.attn.output: matches no value name"),
            "{error}"
        );
        assert!(error.contains("embed, layers.0.attn.out, norm"), "{error}");
        let patterns = TracePatterns::parse(&["norm,*.out,norm"]).unwrap();
        assert_eq!(
            patterns.select(&available).unwrap(),
            ["layers.0.attn.out", "norm"],
            "in the program's order, each once"
        );
    }
}
