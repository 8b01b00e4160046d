"""Durable data plane: SQLite store (`store`), Ray actor and client (`actor`),
byte-exact tensor encoding (`tensors`). See docs/capture.md."""
