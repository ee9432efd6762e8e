// Anchors the vtables of the exception family in the library so that
// embedders and the bindings catch the same types across the shared-library boundary.
#include "megalith/error.h"
