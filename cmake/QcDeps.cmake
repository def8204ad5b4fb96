# Third-party dependencies. Each missing one stops configuration with the Debian package to install.
# tools/install-deps installs all of them.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)

# qc_require_pkg(VAR pkgconfig-name debian-package): imported target PkgConfig::VAR or a clear error.
function(qc_require_pkg var module debpkg)
    pkg_check_modules(${var} QUIET IMPORTED_TARGET GLOBAL ${module})
    if(NOT ${var}_FOUND)
        message(FATAL_ERROR "qctrain needs ${module} (pkg-config) and it was not found.\n"
                            "hint: apt-get install ${debpkg}   (or run tools/install-deps)")
    endif()
endfunction()

qc_require_pkg(JEMALLOC jemalloc libjemalloc-dev)
qc_require_pkg(URING liburing liburing-dev)
qc_require_pkg(CJSON libcjson libcjson-dev)
qc_require_pkg(XXHASH libxxhash libxxhash-dev)
# Prefer Debian's OpenMP build of OpenBLAS: it runs its threads on libgomp's pool, shared with our
# OpenMP ops, instead of a second pool of spinning pthreads fighting them for the cores (several
# times slower on small machines). Its folder lands in the RPATH, so it wins over the default
# libopenblas.so.0 alternative at run time. Falls back to whichever openblas.pc is installed.
set(QC_OPENBLAS_OPENMP_PC "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-openmp/pkgconfig")
if(EXISTS "${QC_OPENBLAS_OPENMP_PC}/openblas.pc")
    set(ENV{PKG_CONFIG_PATH} "${QC_OPENBLAS_OPENMP_PC}:$ENV{PKG_CONFIG_PATH}")
else()
    message(STATUS "qctrain: OpenBLAS's OpenMP build not found; using the default one "
                   "(apt-get install libopenblas-openmp-dev is faster with our OpenMP ops)")
endif()
qc_require_pkg(OPENBLAS openblas libopenblas-dev)

find_package(OpenMP REQUIRED COMPONENTS C)

set(QC_HAVE_MPI OFF)
if(QC_MPI)
    find_package(MPI COMPONENTS C QUIET)
    if(NOT MPI_C_FOUND)
        message(FATAL_ERROR "QC_MPI is ON but OpenMPI was not found.\n"
                            "hint: apt-get install libopenmpi-dev openmpi-bin   (or configure with -DQC_MPI=OFF)")
    endif()
    set(QC_HAVE_MPI ON)
endif()
