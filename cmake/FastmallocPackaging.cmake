# Installation and packaging of fastmalloc, included by the top-level CMakeLists.txt after its
# install() rules: the fastmalloc launcher (build-tree copy and installed copy), fastmalloc.pc,
# the CMake package (find_package(fastmalloc CONFIG)) and the CPack Debian package.
include(CMakePackageConfigHelpers)

set(FM_SONAME libfastmalloc.so.${PROJECT_VERSION_MAJOR})
set(FM_CMAKE_PACKAGE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/fastmalloc)

# fm_install_dir(VAR DIR): VAR = the install-time expression of the GNUInstallDirs DIR, for
# code that runs at install time, where `cmake --install --prefix` may have moved the prefix.
function(fm_install_dir var dir)
  if(IS_ABSOLUTE "${dir}")
    set(${var} "${dir}" PARENT_SCOPE)
  else()
    set(${var} "\${CMAKE_INSTALL_PREFIX}/${dir}" PARENT_SCOPE)
  endif()
endfunction()

# fm_install_configured(TEMPLATE DESTINATION [PROGRAMS] SETTINGS): at install time, configures
# TEMPLATE (@ONLY) with the CMake code SETTINGS run first, where ${CMAKE_INSTALL_PREFIX} is
# the prefix of that installation, and installs the result into DESTINATION (an install-time
# expression). The file is staged per destination, so installs to two prefixes may overlap.
function(fm_install_configured template destination)
  cmake_parse_arguments(arg "PROGRAMS" "" "" ${ARGN})
  get_filename_component(name "${template}" NAME_WLE)
  set(type FILE)
  set(permissions "")
  if(arg_PROGRAMS)
    set(type PROGRAM)
    set(permissions "PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE \
WORLD_READ WORLD_EXECUTE")
  endif()
  install(CODE "
${arg_UNPARSED_ARGUMENTS}
string(MD5 fm_stage \"\$ENV{DESTDIR}${destination}\")
set(fm_stage \"${CMAKE_CURRENT_BINARY_DIR}/install-staging/\${fm_stage}\")
configure_file(\"${template}\" \"\${fm_stage}/${name}\" @ONLY)
file(INSTALL DESTINATION \"${destination}\" TYPE ${type} ${permissions}
  FILES \"\${fm_stage}/${name}\")
file(REMOVE_RECURSE \"\${fm_stage}\")
")
endfunction()

# The launcher. The build tree's copy, ./fastmalloc, preloads the library built here (single-
# configuration generators build it in this directory); the installed copy looks in
# ${CMAKE_INSTALL_LIBDIR} relative to its own directory, then in that of its prefix.
if(NOT CMAKE_CONFIGURATION_TYPES)
  set(FM_VERSION ${PROJECT_VERSION})
  set(FM_REL_LIBDIR "")
  set(FM_ABS_LIBDIR ${CMAKE_CURRENT_BINARY_DIR})
  configure_file(tools/fastmalloc.in ${CMAKE_CURRENT_BINARY_DIR}/fastmalloc @ONLY)
endif()
file(RELATIVE_PATH fm_rel_libdir ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
fm_install_dir(fm_bindir ${CMAKE_INSTALL_BINDIR})
fm_install_dir(fm_libdir ${CMAKE_INSTALL_LIBDIR})
fm_install_configured(${CMAKE_CURRENT_SOURCE_DIR}/tools/fastmalloc.in "${fm_bindir}" PROGRAMS
  "set(FM_VERSION [[${PROJECT_VERSION}]])
   set(FM_SONAME [[${FM_SONAME}]])
   set(FM_REL_LIBDIR [[${fm_rel_libdir}]])
   set(FM_ABS_LIBDIR \"${fm_libdir}\")")

# fastmalloc.pc, its directories written as ${prefix}/... where they lie under the prefix.
foreach(kind LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${kind}}")
    set(fm_pc_${kind} "${CMAKE_INSTALL_${kind}}")
  else()
    set(fm_pc_${kind} "\\\${prefix}/${CMAKE_INSTALL_${kind}}")
  endif()
endforeach()
fm_install_configured(${CMAKE_CURRENT_SOURCE_DIR}/cmake/fastmalloc.pc.in "${fm_libdir}/pkgconfig"
  "set(FM_VERSION [[${PROJECT_VERSION}]])
   set(FM_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
   set(FM_PC_LIBDIR \"${fm_pc_LIBDIR}\")
   set(FM_PC_INCLUDEDIR \"${fm_pc_INCLUDEDIR}\")")

# The CMake package: targets exported by the install(TARGETS ... EXPORT fastmalloc-targets)
# rule, a config file that finds their dependency (Threads), and a version file.
install(EXPORT fastmalloc-targets
  FILE fastmalloc-targets.cmake
  NAMESPACE fastmalloc::
  DESTINATION ${FM_CMAKE_PACKAGE_DIR})
configure_package_config_file(cmake/fastmalloc-config.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/fastmalloc-config.cmake
  INSTALL_DESTINATION ${FM_CMAKE_PACKAGE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/fastmalloc-config-version.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMajorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/fastmalloc-config.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/fastmalloc-config-version.cmake
  DESTINATION ${FM_CMAKE_PACKAGE_DIR})

# The Debian package (`cpack -G DEB` in the build directory): everything installed above,
# under /usr. A source tarball (`cpack --config CPackSourceConfig.cmake`) leaves out build
# directories, results and version control.
set(CPACK_PACKAGE_NAME fastmalloc)
set(CPACK_PACKAGE_VENDOR "fastmalloc")
set(CPACK_PACKAGE_CONTACT "fastmalloc maintainers <maintainer@example.org>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "fast drop-in replacement for the C heap (malloc, free, ...)")
set(CPACK_PACKAGE_DESCRIPTION "fastmalloc replaces malloc, free and the rest of the C heap
API with a thread-caching allocator. The package holds the shared and static
libraries, the header fastmalloc.h, pkg-config and CMake metadata, and the
fastmalloc launcher, which runs a program with the library preloaded.")
set(CPACK_RESOURCE_FILE_LICENSE ${CMAKE_CURRENT_SOURCE_DIR}/LICENSE)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)   # fastmalloc_1.0.0_amd64.deb
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# A shlibs file (dependents get fastmalloc (>= this version)) and ldconfig at (un)install.
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
find_program(FM_DPKG_SHLIBDEPS dpkg-shlibdeps)
if(FM_DPKG_SHLIBDEPS)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)   # Depends: from the libraries' needs (libc6)
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6")
endif()
find_program(FM_DPKG_DEB dpkg-deb)
if(FM_DPKG_DEB)
  set(CPACK_GENERATOR DEB)
else()
  set(CPACK_GENERATOR TGZ)
endif()
set(CPACK_SOURCE_GENERATOR TGZ)
set(CPACK_SOURCE_IGNORE_FILES
  "/\\\\.git/" "/\\\\.git$" "/build[^/]*/" "/results/" "/__pycache__/" "/\\\\.gl/")
include(CPack)
