//! The protocol engine: a pure state machine with no I/O and no clock reads.
