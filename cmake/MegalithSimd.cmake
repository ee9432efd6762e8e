# CPU kernels are compiled once per instruction-set level and chosen at run time
# by CPUID (core/src/cpu/simd_level.cpp), so one wheel runs on any x86-64 and is
# fast on AVX-512 machines. Nothing here uses -march=native. On AArch64 only the
# portable level is built (the compiler vectorises it for NEON).
set(MEGALITH_SIMD_LEVELS "scalar")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  list(APPEND MEGALITH_SIMD_LEVELS avx2 avx512)
endif()

set(MEGALITH_SIMD_FLAGS_scalar "")
set(MEGALITH_SIMD_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(MEGALITH_SIMD_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c)

# megalith_add_simd_kernels(TARGET SOURCE)
# Adds SOURCE to TARGET once per level, each copy compiled with that level's
# flags and MEGALITH_SIMD_<LEVEL> defined (the source picks its namespace from it).
function(megalith_add_simd_kernels target source)
  foreach(level IN LISTS MEGALITH_SIMD_LEVELS)
    set(copy "${CMAKE_CURRENT_BINARY_DIR}/simd/${level}/${source}")
    get_filename_component(dir "${copy}" DIRECTORY)
    file(MAKE_DIRECTORY "${dir}")
    get_filename_component(abs "${source}" ABSOLUTE)
    file(WRITE "${copy}.tmp" "#include \"${abs}\"\n")
    configure_file("${copy}.tmp" "${copy}" COPYONLY)
    string(TOUPPER "${level}" LEVEL)
    set_source_files_properties("${copy}" PROPERTIES
      COMPILE_OPTIONS "${MEGALITH_SIMD_FLAGS_${level}};-fno-math-errno;$<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>"
      COMPILE_DEFINITIONS "MEGALITH_SIMD_${LEVEL}=1")
    target_sources(${target} PRIVATE "${copy}")
  endforeach()
endfunction()
