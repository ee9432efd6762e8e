# Install the C++ library for embedding: headers, libmegalith_core and
# megalithConfig.cmake. Inside a wheel they go under megalith_core/ so that
# `python -m megalith_core --cmake-dir` can point find_package at them.
include(CMakePackageConfigHelpers)

if(DEFINED SKBUILD)
  set(MEGALITH_INSTALL_LIBDIR megalith_core/lib)
  set(MEGALITH_INSTALL_INCLUDEDIR megalith_core/include)
else()
  set(MEGALITH_INSTALL_LIBDIR ${CMAKE_INSTALL_LIBDIR})
  set(MEGALITH_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR})
endif()
set(MEGALITH_INSTALL_CMAKEDIR ${MEGALITH_INSTALL_LIBDIR}/cmake/megalith)

install(TARGETS megalith_core EXPORT megalithTargets
  LIBRARY DESTINATION ${MEGALITH_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${MEGALITH_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${MEGALITH_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${MEGALITH_INSTALL_INCLUDEDIR})
install(DIRECTORY core/include/megalith DESTINATION ${MEGALITH_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES "${PROJECT_BINARY_DIR}/generated/megalith/config.h"
        DESTINATION ${MEGALITH_INSTALL_INCLUDEDIR}/megalith)
install(EXPORT megalithTargets NAMESPACE megalith:: DESTINATION ${MEGALITH_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/megalithConfig.cmake.in
  "${PROJECT_BINARY_DIR}/megalithConfig.cmake"
  INSTALL_DESTINATION ${MEGALITH_INSTALL_CMAKEDIR})
write_basic_package_version_file("${PROJECT_BINARY_DIR}/megalithConfigVersion.cmake"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/megalithConfig.cmake"
              "${PROJECT_BINARY_DIR}/megalithConfigVersion.cmake"
        DESTINATION ${MEGALITH_INSTALL_CMAKEDIR})
