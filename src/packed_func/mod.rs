//! packed functions
