# cmake -P script behind the ctest test `install: consumer`: installs the
# build tree into a scratch prefix, then configures, builds and runs the
# outside project tests/consumer against it.
# Inputs: QGRAD_BUILD_DIR, CONSUMER_SOURCE, WORK_DIR, GENERATOR, CXX_COMPILER,
# CUDA_COMPILER (may be empty).
foreach(v QGRAD_BUILD_DIR CONSUMER_SOURCE WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${v} OR "${${v}}" STREQUAL "")
    message(FATAL_ERROR "run.cmake: ${v} is not set")
  endif()
endforeach()

function(step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "install/consumer step failed (${rc}): ${cmd}")
  endif()
endfunction()

set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${WORK_DIR})
step(${CMAKE_COMMAND} --install ${QGRAD_BUILD_DIR} --prefix ${prefix})

# The installed tree must hold the public headers and the package files,
# all under include/qgrad/; the kernel layer is private to ops and its
# headers are not installed.
foreach(f include/qgrad/qgrad.h include/qgrad/core/tensor.h include/qgrad/autograd/node.h
          include/qgrad/autograd/dot.h include/qgrad/ops/ops.h include/qgrad/nn/nn.h)
  if(NOT EXISTS ${prefix}/${f})
    message(FATAL_ERROR "install: ${f} is missing from ${prefix}")
  endif()
endforeach()
file(GLOB top RELATIVE ${prefix}/include ${prefix}/include/*)
if(NOT top STREQUAL "qgrad")
  message(FATAL_ERROR "install: ${prefix}/include holds '${top}', expected only qgrad/")
endif()
if(EXISTS ${prefix}/include/qgrad/kernels)
  message(FATAL_ERROR "install: the private kernel headers were installed")
endif()
file(GLOB_RECURSE config ${prefix}/*/qgradConfig.cmake)
if(NOT config)
  message(FATAL_ERROR "install: no qgradConfig.cmake under ${prefix}")
endif()

set(args -S ${CONSUMER_SOURCE} -B ${build} -G ${GENERATOR} -DCMAKE_BUILD_TYPE=Release
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${CXX_COMPILER})
if(CUDA_COMPILER)
  get_filename_component(cuda_bin ${CUDA_COMPILER} DIRECTORY)
  get_filename_component(cuda_root ${cuda_bin} DIRECTORY)
  list(APPEND args -DCUDAToolkit_ROOT=${cuda_root})
endif()
step(${CMAKE_COMMAND} ${args})
step(${CMAKE_COMMAND} --build ${build})
step(${build}/qgrad_consumer)
file(REMOVE_RECURSE ${WORK_DIR})
