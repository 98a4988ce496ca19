"""P4_16 front end of the software target: preprocessor and lexer, parser, AST, type and semantic
checker, and the code generator that turns a checked program into Python once per pipeline load.
See docs/p4target.md for the supported subset."""
