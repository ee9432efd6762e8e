#pragma once

// Symbols of libmegalith_core that embedders may call. Everything else is hidden.
#if defined(_WIN32)
#if defined(MEGALITH_BUILDING_CORE)
#define MEGALITH_API __declspec(dllexport)
#else
#define MEGALITH_API __declspec(dllimport)
#endif
#else
#define MEGALITH_API __attribute__((visibility("default")))
#endif
