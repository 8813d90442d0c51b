//! The tcp transport: verbs semantics over a TCP stream, for hosts without RDMA.
