"""The template: the fork server, a warm interpreter that holds no job's data."""
