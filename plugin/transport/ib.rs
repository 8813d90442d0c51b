//! The ib transport: RC queue pairs over libibverbs, resolved at run time.
