"""The baseline every paper is compared with: a byte-level Transformer LM."""
