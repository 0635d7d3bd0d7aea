//! `kiln tokenize`: a UTF-8 text file encoded by a Hugging Face tokenizer into the token file
//! `kiln train` reads — flat little-endian ids (nanoGPT's `train.bin` format) or a safetensors
//! file with a `tokens` tensor — with a progress bar over the bytes read.
//!
//! The text is encoded in pieces of about 1 MiB cut after a newline (no special tokens added),
//! so the tokenizer never holds the whole text; the ids are held, then written. A piece
//! boundary is a line boundary: a tokenizer that merges across newlines (runs of blank lines)
//! or prefixes each call (SentencePiece's "▁") can give a token more or less there than one
//! call over the whole text would.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_engine::tokenizer::{Tokenizer, TOKENIZER_FILE};
use kiln_frontend::hf::safetensors_io::{check_absent, write_file_atomically, write_safetensors};
use kiln_runtime::Tensor;
use kiln_trainer::TokenDType;

/// Bytes of text encoded at once.
const PIECE: usize = 1 << 20;

pub fn tokenize(
    tokenizer: &Path,
    input: &Path,
    out: &Path,
    dtype: Option<TokenDType>,
) -> Result<()> {
    check_absent(out)?;
    let tokenizer = if tokenizer.is_dir() {
        Tokenizer::from_files(&tokenizer.join(TOKENIZER_FILE), None)
    } else {
        Tokenizer::from_files(tokenizer, None)
    }
    .with_context(|| format!("loading tokenizer {}", tokenizer.display()))?;
    let vocab = tokenizer.vocab_size();
    let safetensors = out.extension().is_some_and(|e| e == "safetensors");
    if safetensors && dtype.is_some() {
        bail!("--dtype is for flat files; a .safetensors output holds i64 ids");
    }
    let dtype = dtype.unwrap_or(TokenDType::for_vocab(vocab));
    if !safetensors && dtype == TokenDType::U16 && vocab > 1 << 16 {
        bail!("--dtype u16 cannot hold the ids of a vocabulary of {vocab}; use u32");
    }
    let file = File::open(input).with_context(|| format!("opening --in {}", input.display()))?;
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let bar = ProgressBar::new(size).with_style(
        ProgressStyle::with_template("tokenizing [{bar:40}] {bytes}/{total_bytes} {msg} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut reader = BufReader::with_capacity(PIECE, file);
    let mut ids: Vec<u32> = Vec::new();
    let mut piece = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        let read = reader
            .read_line(&mut line)
            .with_context(|| format!("reading --in {} (is it UTF-8 text?)", input.display()))?;
        piece.push_str(&line);
        if (read == 0 || piece.len() >= PIECE) && !piece.is_empty() {
            ids.extend(tokenizer.encode(&piece, false)?);
            bar.inc(piece.len() as u64);
            bar.set_message(format!("{} tokens", ids.len()));
            piece.clear();
        }
        if read == 0 {
            break;
        }
    }
    bar.finish_and_clear();
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        bail!("the tokenizer produced id {bad}, outside its own vocabulary of {vocab}");
    }
    if safetensors {
        let wide: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
        let tensor = Tensor::from_vec(wide, [ids.len()])?;
        write_safetensors(out, &[("tokens".to_string(), tensor)], None)?;
    } else {
        let bytes: Vec<u8> = match dtype {
            TokenDType::U16 => ids
                .iter()
                .flat_map(|&id| (id as u16).to_le_bytes())
                .collect(),
            _ => ids.iter().flat_map(|&id| id.to_le_bytes()).collect(),
        };
        write_file_atomically(out, &bytes)?;
    }
    println!(
        "wrote {} tokens ({}, vocabulary {vocab}) of {} to {}",
        ids.len(),
        if safetensors {
            "i64 safetensors"
        } else {
            dtype.name()
        },
        input.display(),
        out.display()
    );
    Ok(())
}
