//! attn-core: placeholder, being written.
