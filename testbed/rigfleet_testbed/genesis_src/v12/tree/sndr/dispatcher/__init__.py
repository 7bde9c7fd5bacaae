"""The patch registry (data) and the apply/skip decision."""
