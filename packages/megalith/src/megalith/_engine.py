"""megalith._engine is megalith_core._engine, the compiled engine of the floor dist."""

from megalith_core._alias import alias_module

alias_module(__name__, "megalith_core._engine")
