"""mocap_jax: a JAX-vectorised simulator of long-context prefill-only LLM inference on
wafer-scale chips (MOCAP: chunked pipelining, MBKR, LBCP, against GPipe and TeraPipe)
and of prefill/decode serving co-exploration on a wafer (WSC-LLM)."""

__version__ = "0.2.0"
