"""Evaluation: benchmark metrics as pure functions (QASPER's official Answer-F1 and Evidence-F1)."""
