//! kiln-planner: turns a program graph into a plan.
//!
//! It will own the schedule (memory-aware topological orders), buffers and their lifetimes,
//! arena offsets from a portfolio of heuristics with the exact lower bound of live bytes,
//! streams and events, the serializable `Plan` with a stable hash, an independent plan
//! verifier, and the plan dumps (text, JSON, CSV, SVG). It knows sizes, lifetimes and
//! dependencies, never pointers.
