"""Shell command builders: they return command strings and run nothing (a role decides when a
command runs, these modules what it is). Every value goes through ``shlex.quote``; secrets
never appear in a command (they travel as root-only files the commands read)."""
