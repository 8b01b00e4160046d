"""Token capture: prefix splicing (`splice`), records (`records`), the ledger
(`ledger`), trainer-side admission (`admission`), the engine-side sink
(`sink`), receipts (`receipt`) and finalisation (`finalize`).
See docs/capture.md for the flow and the public API."""
