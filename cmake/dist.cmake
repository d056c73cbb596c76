# The dist layer (dist/): process groups, DistributedDataParallel, and the
# launcher qgrad-run. Included from the top-level CMakeLists.txt after nn.
#
# Gloo (CPU tensors): Debian's libgloo-dev ships a CMake config (Gloo, target
# `gloo`, headers under /usr/include/gloo) built with the TCP transport
# (gloo/config.h: GLOO_HAVE_TRANSPORT_TCP 1); that transport is what dist/
# uses, so a Gloo without it counts as absent.
#
# NCCL (CUDA tensors; CUDA builds only). Looked for, as cuDNN is: in
# QGRAD_NCCL_ROOT alone when it is set (a folder with include/nccl.h and lib/
# or lib64/ holding libnccl.so or libnccl.so.2); otherwise in the CUDA toolkit
# (the build and CI machines), then in the Python wheel nvidia-nccl-cu13 (or
# -cu12) of QGRAD_PYTHON or of python3 on PATH (the GPU machine's PyTorch
# environment). scripts/gpu_check.sh puts its folder on LD_LIBRARY_PATH.
set(QGRAD_GLOO AUTO CACHE STRING "Gloo for CPU collectives: AUTO, ON or OFF")
set_property(CACHE QGRAD_GLOO PROPERTY STRINGS AUTO ON OFF)
set(QGRAD_NCCL AUTO CACHE STRING "NCCL for CUDA collectives (CUDA builds): AUTO, ON or OFF")
set_property(CACHE QGRAD_NCCL PROPERTY STRINGS AUTO ON OFF)
set(QGRAD_NCCL_ROOT "" CACHE PATH "NCCL install prefix (include/nccl.h, lib or lib64); empty: search")

set(QGRAD_WITH_GLOO OFF)
set(qgrad_gloo_why "QGRAD_GLOO=OFF")
if(NOT QGRAD_GLOO STREQUAL "OFF")
  find_package(Gloo CONFIG QUIET)
  if(Gloo_FOUND AND TARGET gloo)
    get_target_property(qgrad_gloo_inc gloo INTERFACE_INCLUDE_DIRECTORIES)
    find_file(qgrad_gloo_tcp gloo/transport/tcp/device.h PATHS ${qgrad_gloo_inc} NO_DEFAULT_PATH NO_CACHE)
    find_file(qgrad_gloo_config gloo/config.h PATHS ${qgrad_gloo_inc} NO_DEFAULT_PATH NO_CACHE)
    set(qgrad_gloo_has_tcp "")
    if(qgrad_gloo_config)
      file(STRINGS ${qgrad_gloo_config} qgrad_gloo_has_tcp REGEX "^#define GLOO_HAVE_TRANSPORT_TCP 1")
    endif()
    if(qgrad_gloo_tcp AND qgrad_gloo_has_tcp)
      set(QGRAD_WITH_GLOO ON)
    else()
      set(qgrad_gloo_why "Gloo ${Gloo_VERSION} was built without the TCP transport")
    endif()
  else()
    set(qgrad_gloo_why "Gloo not found (Debian: apt-get install libgloo-dev)")
  endif()
  if(QGRAD_GLOO STREQUAL "ON" AND NOT QGRAD_WITH_GLOO)
    message(FATAL_ERROR "QGRAD_GLOO=ON but ${qgrad_gloo_why}")
  endif()
endif()

set(QGRAD_WITH_NCCL OFF)
set(qgrad_nccl_why "QGRAD_NCCL=OFF")
if(NOT QGRAD_WITH_CUDA)
  set(qgrad_nccl_why "no CUDA backend")
elseif(NOT QGRAD_NCCL STREQUAL "OFF")
  qgrad_find_nvidia_library(PREFIX QGRAD_NCCL ROOT "${QGRAD_NCCL_ROOT}" MODULE nvidia.nccl HEADER nccl.h
                            NAMES nccl libnccl.so.2)
  set(qgrad_nccl_hints ${QGRAD_NCCL_HINTS})
  if(QGRAD_NCCL_LIBRARY)
    set(QGRAD_WITH_NCCL ON)
    get_filename_component(qgrad_nccl_dir ${QGRAD_NCCL_LIBRARY} DIRECTORY)
    set(QGRAD_NCCL_LIBRARY_DIR ${qgrad_nccl_dir} CACHE INTERNAL "the folder of libnccl")
    set(QGRAD_NCCL_LIBRARY_PATH ${QGRAD_NCCL_LIBRARY} CACHE INTERNAL "libnccl")
  else()
    set(qgrad_nccl_why "nccl.h with libnccl.so(.2) not found; looked in: ${qgrad_nccl_hints}")
    if(QGRAD_NCCL STREQUAL "ON")
      message(FATAL_ERROR "QGRAD_NCCL=ON but ${qgrad_nccl_why}. Pass -DQGRAD_NCCL_ROOT=<prefix> "
                          "(for the PyTorch wheel: python3 -c 'import nvidia.nccl; print(nvidia.nccl.__path__)').")
    endif()
  endif()
endif()

set(QGRAD_DIST_SOURCES ${PROJECT_SOURCE_DIR}/dist/store.cpp ${PROJECT_SOURCE_DIR}/dist/process_group.cpp
    ${PROJECT_SOURCE_DIR}/dist/ddp.cpp)
set(QGRAD_DIST_PRIVATE Threads::Threads)
if(QGRAD_WITH_GLOO)
  list(APPEND QGRAD_DIST_SOURCES ${PROJECT_SOURCE_DIR}/dist/gloo_backend.cpp)
  list(APPEND QGRAD_DIST_PRIVATE gloo)
else()
  list(APPEND QGRAD_DIST_SOURCES ${PROJECT_SOURCE_DIR}/dist/gloo_stub.cpp)
endif()
if(QGRAD_WITH_NCCL)
  list(APPEND QGRAD_DIST_SOURCES ${PROJECT_SOURCE_DIR}/dist/nccl_backend.cpp)
  list(APPEND QGRAD_DIST_PRIVATE CUDA::cudart ${QGRAD_NCCL_LIBRARY})
else()
  list(APPEND QGRAD_DIST_SOURCES ${PROJECT_SOURCE_DIR}/dist/nccl_stub.cpp)
endif()
qgrad_layer(dist SOURCES ${QGRAD_DIST_SOURCES} PUBLIC qgrad_nn PRIVATE ${QGRAD_DIST_PRIVATE})
target_compile_definitions(qgrad_dist PUBLIC QGRAD_WITH_GLOO=$<BOOL:${QGRAD_WITH_GLOO}>
                           QGRAD_WITH_NCCL=$<BOOL:${QGRAD_WITH_NCCL}>)
if(QGRAD_WITH_NCCL)
  target_include_directories(qgrad_dist PRIVATE $<BUILD_INTERFACE:${QGRAD_NCCL_INCLUDE_DIR}>)
  set_target_properties(qgrad_dist PROPERTIES INSTALL_RPATH "${qgrad_nccl_dir}")
endif()

if(QGRAD_WITH_GLOO)
  message(STATUS "qgrad: Gloo ON (Gloo ${Gloo_VERSION}, TCP transport): CPU collectives")
else()
  message(STATUS "qgrad: Gloo OFF (${qgrad_gloo_why}): CPU collectives throw")
endif()
if(QGRAD_WITH_NCCL)
  message(STATUS "qgrad: NCCL ON: ${QGRAD_NCCL_LIBRARY} (headers ${QGRAD_NCCL_INCLUDE_DIR})")
else()
  message(STATUS "qgrad: NCCL OFF (${qgrad_nccl_why}): CUDA collectives throw")
endif()

# The launcher (dist/run/main.cpp): needs CLI11, as the examples do.
find_package(CLI11 QUIET)
if(CLI11_FOUND)
  add_executable(qgrad-run ${PROJECT_SOURCE_DIR}/dist/run/main.cpp)
  target_link_libraries(qgrad-run PRIVATE CLI11::CLI11 qgrad_warnings Threads::Threads)
  install(TARGETS qgrad-run RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
