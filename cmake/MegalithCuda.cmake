# Decide whether the CUDA kernels are built (MEGALITH_CUDA=AUTO|ON|OFF).
# Result: MEGALITH_HAS_CUDA (bool) and, when on, the CUDA language enabled with
# CMAKE_CUDA_ARCHITECTURES defaulting to sm_80 and sm_90 machine code plus
# compute_90 PTX so newer GPUs can still load the kernels.
include(CheckLanguage)

string(TOUPPER "${MEGALITH_CUDA}" _mode)
set(MEGALITH_HAS_CUDA OFF)
if(_mode STREQUAL "OFF")
  message(STATUS "megalith: CUDA kernels off (MEGALITH_CUDA=OFF)")
else()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
    set(CMAKE_CUDA_ARCHITECTURES "80-real;90-real;90-virtual")
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    set(MEGALITH_HAS_CUDA ON)
    message(STATUS "megalith: CUDA kernels on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")
  elseif(_mode STREQUAL "ON")
    message(FATAL_ERROR
      "megalith: MEGALITH_CUDA=ON but no CUDA compiler was found. Install the CUDA toolkit "
      "and put nvcc on PATH (or set CMAKE_CUDA_COMPILER), or build with MEGALITH_CUDA=OFF.")
  else()
    message(STATUS "megalith: no CUDA compiler found; building the CPU engine only")
  endif()
endif()
