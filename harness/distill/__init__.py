"""On-policy distillation (docs/distill.md): teacher logits shared with the student by IPC
(``teacher_ipc``), the teacher's policy group (``teacher``), the student's reader and loss (``student``)."""
