"""Course code: exercises (see minillm.grading)."""
