"""local: being written (issue #12); registers nothing yet."""
