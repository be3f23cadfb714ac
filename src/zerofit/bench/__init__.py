"""`zerofit bench`: variants of one run side by side, and the files it leaves behind."""
