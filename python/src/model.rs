//! `kiln.load` and `kiln.Model`: a loaded model and what it offers — compiled programs,
//! evaluation named as `kiln eval`'s output file, plans and generation.

use kiln_capi::generation::{GenerateOptions, Prompt};
use kiln_capi::session::{
    parse_precision, parse_program, parse_run_mode, DeviceKind, EvalMode, Model,
};
use kiln_engine::sampling::SamplingParams;
use kiln_planner::{dump, Plan};
use kiln_runtime::Workspaces;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::to_py;
use crate::program::PyProgram;
use crate::tensor::{input_tensor, to_numpy};
use crate::thread_bound::ThreadBound;

/// Loads a model: a Hugging Face directory (config.json + safetensors) or a preset name
/// ("tiny", "qwen2.5-0.5b", ...; random weights from `seed`), for `device` "cpu" or "cuda",
/// in `precision` "f32", "bf16-gemm", "bf16-swiglu" or "bf16" — exactly as `kiln eval
/// --model` loads it.
#[pyfunction]
#[pyo3(signature = (model, device="cpu", precision="f32", seed=0))]
pub fn load(
    py: Python<'_>,
    model: &str,
    device: &str,
    precision: &str,
    seed: u64,
) -> PyResult<PyModel> {
    let device = DeviceKind::parse(device).map_err(to_py)?;
    let precision = parse_precision(precision).map_err(to_py)?;
    let model = Model::load(model, device, precision, seed).map_err(to_py)?;
    let warnings = py.import("warnings")?;
    for note in &model.notes {
        warnings.call_method1("warn", (note.as_str(),))?;
    }
    Ok(PyModel {
        model: ThreadBound::new(model, "kiln.Model"),
    })
}

/// A loaded model (`kiln.load`), used on the thread that loaded it.
#[pyclass(module = "kiln", name = "Model")]
pub struct PyModel {
    model: ThreadBound<Model>,
}

/// A plan (`Model.plan`): its numbers, its dict and its dumps.
#[pyclass(module = "kiln", name = "Plan", frozen)]
pub struct PyPlan {
    plan: Plan,
}

#[pymethods]
impl PyPlan {
    /// Bytes of the one activation arena.
    #[getter]
    fn arena_bytes(&self) -> u64 {
        self.plan.arena_bytes
    }

    /// The exact lower bound of live bytes the arena is measured against.
    #[getter]
    fn lower_bound_bytes(&self) -> u64 {
        self.plan.lower_bound_bytes
    }

    /// The plan as a dict (the JSON dump, parsed).
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("json")?
            .call_method1("loads", (dump::to_json(&self.plan),))
    }

    /// A dump as `kiln plan --format` writes it: "text", "json", "csv" or "svg".
    #[pyo3(signature = (format="text"))]
    fn dump(&self, format: &str) -> PyResult<String> {
        match format {
            "text" => Ok(dump::to_text(&self.plan, None)),
            "json" => Ok(dump::to_json(&self.plan)),
            "csv" => Ok(dump::to_csv(&self.plan)),
            "svg" => Ok(dump::to_svg(&self.plan)),
            other => Err(PyValueError::new_err(format!(
                "format `{other}`: expected \"text\", \"json\", \"csv\" or \"svg\""
            ))),
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "kiln.Plan({} buffers, arena {} B, lower bound {} B)",
            self.plan.buffers.len(),
            self.plan.arena_bytes,
            self.plan.lower_bound_bytes
        )
    }
}

#[pymethods]
impl PyModel {
    /// The path or preset name it was loaded from.
    #[getter]
    fn name(&self) -> PyResult<String> {
        Ok(self.model.get()?.name().to_string())
    }

    /// "cpu" or "cuda".
    #[getter]
    fn device(&self) -> PyResult<&'static str> {
        Ok(self.model.get()?.device().name())
    }

    /// "f32", "bf16-gemm", "bf16-swiglu" or "bf16".
    #[getter]
    fn precision(&self) -> PyResult<&'static str> {
        Ok(self.model.get()?.precision().name())
    }

    /// The model's shape: vocabulary, layers, heads and sizes.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.model.get()?.config();
        let dict = PyDict::new(py);
        for (key, value) in [
            ("vocab_size", c.vocab_size),
            ("hidden_size", c.hidden_size),
            ("intermediate_size", c.intermediate_size),
            ("num_hidden_layers", c.num_hidden_layers),
            ("num_attention_heads", c.num_attention_heads),
            ("num_key_value_heads", c.num_key_value_heads),
            ("head_dim", c.head_dim),
            ("max_position_embeddings", c.max_position_embeddings),
        ] {
            dict.set_item(key, value)?;
        }
        dict.set_item("tie_word_embeddings", c.tie_word_embeddings)?;
        Ok(dict)
    }

    /// Compiles `program` ("prefill", "decode", "train" or "eval") for `batch` rows of `seq`
    /// tokens (a KV cache of `max_seq` rows for prefill and decode), run per `mode` ("eager",
    /// or "graph": recorded once and replayed). The weights are set and every state is zero.
    /// `eval` is compiled with gradients: it takes `targets` and `loss_seed` besides the
    /// tokens and positions, and outputs `grad.<parameter>` too (see `Program.inputs`).
    #[pyo3(signature = (program, batch=1, seq=16, max_seq=None, mode="eager", fusion=true))]
    fn compile(
        &self,
        program: &str,
        batch: usize,
        seq: usize,
        max_seq: Option<usize>,
        mode: &str,
        fusion: bool,
    ) -> PyResult<PyProgram> {
        let kind = parse_program(program).map_err(to_py)?;
        let mode = parse_run_mode(mode).map_err(to_py)?;
        let model = self.model.get()?;
        let options =
            (model.program_options(kind, (batch, seq, max_seq), fusion)).map_err(to_py)?;
        let program = model.compile(kind, &options, mode).map_err(to_py)?;
        Ok(PyProgram {
            program: ThreadBound::new(program, "kiln.Program"),
        })
    }

    /// `logits`, `loss` and with `grads` every `grad.<parameter>` for integer `tokens` [B,T],
    /// as NumPy arrays named and computed exactly as `kiln eval --mode mode` writes them.
    #[pyo3(signature = (tokens, grads=false, mode="oracle"))]
    fn eval<'py>(
        &self,
        py: Python<'py>,
        tokens: &Bound<'py, PyAny>,
        grads: bool,
        mode: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mode = EvalMode::parse(mode).map_err(to_py)?;
        let tokens = input_tensor(tokens, "tokens")?;
        let named = self
            .model
            .get()?
            .eval(&tokens, grads, mode)
            .map_err(to_py)?;
        let dict = PyDict::new(py);
        for (name, tensor) in named {
            dict.set_item(name, to_numpy(py, &tensor)?)?;
        }
        Ok(dict)
    }

    /// Plans `program` as `kiln plan --verify` does, with `streams` streams and workspaces for
    /// `backend` ("cpu", "cuda" or "any").
    #[pyo3(signature = (program, batch=1, seq=16, max_seq=None, streams=1, backend="any", fusion=true))]
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        program: &str,
        batch: usize,
        seq: usize,
        max_seq: Option<usize>,
        streams: usize,
        backend: &str,
        fusion: bool,
    ) -> PyResult<PyPlan> {
        let kind = parse_program(program).map_err(to_py)?;
        let workspaces = match backend {
            "cpu" => Workspaces::Cpu,
            "cuda" => Workspaces::Cuda,
            "any" => Workspaces::Any,
            other => {
                return Err(PyValueError::new_err(format!(
                    "backend `{other}`: expected \"cpu\", \"cuda\" or \"any\""
                )))
            }
        };
        let model = self.model.get()?;
        let options =
            (model.program_options(kind, (batch, seq, max_seq), fusion)).map_err(to_py)?;
        let plan = (model.plan(kind, &options, streams, workspaces)).map_err(to_py)?;
        Ok(PyPlan { plan })
    }

    /// Continues `prompt` (text, through the model directory's tokenizer, or a list of token
    /// ids) with the serial reference generator, as `kiln generate` does. `temperature` 0 is
    /// greedy. Returns `{"prompt": ids, "tokens": ids, "text": str or None,
    /// "finish_reason": "stop" or "length"}`.
    #[pyo3(signature = (prompt, max_new_tokens=16, temperature=0.0, top_k=0, top_p=1.0,
        min_p=0.0, repetition_penalty=1.0, seed=0, stop=None, mode="eager"))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompt: &Bound<'py, PyAny>,
        max_new_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        repetition_penalty: f32,
        seed: u64,
        stop: Option<Vec<String>>,
        mode: &str,
    ) -> PyResult<Bound<'py, PyDict>> {
        let prompt = match prompt.extract::<String>() {
            Ok(text) => Prompt::Text(text),
            Err(_) => Prompt::Ids(prompt.extract::<Vec<u32>>().map_err(|_| {
                PyValueError::new_err("prompt: expected a str or a list of token ids (>= 0)")
            })?),
        };
        let options = GenerateOptions {
            max_new_tokens,
            sampling: SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty,
                seed,
            },
            stop: stop.unwrap_or_default(),
            mode: parse_run_mode(mode).map_err(to_py)?,
        };
        let generated = self.model.get()?.generate(prompt, options).map_err(to_py)?;
        let dict = PyDict::new(py);
        dict.set_item("prompt", generated.prompt)?;
        dict.set_item("tokens", generated.tokens)?;
        dict.set_item("text", generated.text)?;
        dict.set_item("finish_reason", generated.finish_reason)?;
        Ok(dict)
    }

    fn __repr__(&self) -> PyResult<String> {
        let model = self.model.get()?;
        Ok(format!(
            "kiln.Model({:?}, device={}, precision={})",
            model.name(),
            model.device().name(),
            model.precision().name()
        ))
    }
}
