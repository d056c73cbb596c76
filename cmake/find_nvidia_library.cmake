# qgrad_find_nvidia_library(PREFIX <VAR> ROOT <root> MODULE <python module>
#                           HEADER <header> NAMES <library names...>)
#
# One search for the NVIDIA libraries that may live outside the CUDA toolkit
# (cuDNN, NCCL). Looked at, in order: ROOT alone when it is set; otherwise
# the CUDA toolkit (the build and CI machines), then the Python wheel holding
# MODULE (nvidia.cudnn, nvidia.nccl) of QGRAD_PYTHON or of python3 on PATH
# (the GPU machine's PyTorch environment). The header and the library come
# from one place: the first folder that holds both (searched at every
# configure, so nothing stale stays in the cache). Sets in the caller:
#   <VAR>_INCLUDE_DIR, <VAR>_LIBRARY (empty when not found),
#   <VAR>_HINTS (the folders looked at, for the error message).
function(qgrad_find_nvidia_library)
  cmake_parse_arguments(F "" "PREFIX;ROOT;MODULE;HEADER" "NAMES" ${ARGN})
  if(F_ROOT)  # an explicit root is the only place looked at
    set(hints ${F_ROOT})
  else()
    set(hints ${CUDAToolkit_TARGET_DIR} ${CUDAToolkit_LIBRARY_ROOT})
    find_program(qgrad_python3_on_path NAMES python3)
    foreach(py ${QGRAD_PYTHON} ${qgrad_python3_on_path})
      if(py)
        execute_process(
          COMMAND ${py} -c "import ${F_MODULE} as m; print(list(m.__path__)[0])"
          OUTPUT_VARIABLE wheel OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
        if(rc EQUAL 0 AND EXISTS "${wheel}/include/${F_HEADER}")
          list(APPEND hints ${wheel})
        endif()
      endif()
    endforeach()
  endif()
  set(include_dir "")
  set(library "")
  foreach(dir ${hints})
    if(NOT library)
      find_path(inc ${F_HEADER} PATHS ${dir} PATH_SUFFIXES include NO_DEFAULT_PATH NO_CACHE)
      find_library(lib NAMES ${F_NAMES} NAMES_PER_DIR PATHS ${dir} PATH_SUFFIXES lib64 lib NO_DEFAULT_PATH NO_CACHE)
      if(inc AND lib)
        string(REGEX REPLACE "/+$" "" include_dir "${inc}")
        set(library ${lib})
      endif()
      unset(inc)
      unset(lib)
    endif()
  endforeach()
  set(${F_PREFIX}_INCLUDE_DIR "${include_dir}" PARENT_SCOPE)
  set(${F_PREFIX}_LIBRARY "${library}" PARENT_SCOPE)
  set(${F_PREFIX}_HINTS "${hints}" PARENT_SCOPE)
endfunction()
