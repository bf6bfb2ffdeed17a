# Packages a project can depend on: the static library `sdpa` (target sdpa::sdpa), a shared
# library built from the same objects (sdpa::sdpa_shared, file libsdpa.so.MAJOR.MINOR), the CMake
# package (find_package(sdpa)) and a pkg-config file (sdpa.pc). Included at the end of the top
# CMakeLists.txt, once every area has added its sources to `sdpa`.
#
# The shared library links the static archive whole (CMAKE_POSITION_INDEPENDENT_CODE is ON, so its
# objects are already position-independent): nothing is compiled twice, which matters because the
# fused kernel is compiled for six Highway targets.
# CMake wants one source of its own: an empty file.
file(WRITE ${PROJECT_BINARY_DIR}/sdpa_shared.cpp "// libsdpa.so: its code is libsdpa.a's, linked whole.\n")
add_library(sdpa_shared SHARED ${PROJECT_BINARY_DIR}/sdpa_shared.cpp)
add_library(sdpa::sdpa_shared ALIAS sdpa_shared)
target_link_libraries(sdpa_shared PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,sdpa>")
target_include_directories(sdpa_shared PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(sdpa_shared PUBLIC cxx_std_20)
# SOVERSION MAJOR.MINOR: before 1.0 every minor release may change the ABI (the CMake package's
# version file says the same: SameMinorVersion).
set_target_properties(sdpa_shared PROPERTIES
  OUTPUT_NAME sdpa
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}
  EXPORT_NAME sdpa_shared)

include(CMakePackageConfigHelpers)
install(TARGETS sdpa sdpa_shared EXPORT sdpaTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY include/sdpa DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT sdpaTargets NAMESPACE sdpa:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sdpa)
configure_package_config_file(cmake/sdpaConfig.cmake.in
  ${PROJECT_BINARY_DIR}/sdpaConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sdpa)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sdpaConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sdpaConfig.cmake ${PROJECT_BINARY_DIR}/sdpaConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/sdpa)

# pkg-config: `pkg-config --cflags --libs sdpa` links the shared library; `--static` adds the
# static archive's own dependencies (Requires.private / Libs.private). The paths are written
# relative to ${pcfiledir}, so an installed tree can be moved.
file(RELATIVE_PATH SDPA_PC_PREFIX_FROM_PCDIR
  "${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig" "${CMAKE_INSTALL_PREFIX}")
set(SDPA_PC_OPENMP_FLAGS "${OpenMP_CXX_FLAGS}")
configure_file(cmake/sdpa.pc.in ${PROJECT_BINARY_DIR}/sdpa.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/sdpa.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
