"""Course code: solutions (see minillm.grading)."""
