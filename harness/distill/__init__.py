"""On-policy distillation: teacher logits shared with the student by IPC (``teacher_ipc``)."""
