"""Shell command builders: strings, run by a role when it decides. Every value goes through
``shlex.quote``; secrets never appear in a command (they travel as root-only files it reads)."""
