//! `tracing` events bridged to NCCL's logger (or to stderr outside NCCL).
