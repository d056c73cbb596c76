# qgrad-qat-mlp --export-onnx on CPU (1 float + 1 QAT epoch on 10000 training
# images), then scripts/onnx_check.py runs both exported models with
# onnxruntime on the full Fashion-MNIST test set: the int8 graph must agree
# with qgrad's int8 model on >= 99.9% of the images, the QDQ graph with its
# fake-quant model on >= 99.5%. Skipped without the data set, without ONNX
# in the build (ONNX=OFF) or without onnx/onnxruntime in PYTHON.
set(data /usr/share/datasets/fashion-mnist)
set(skip "")
if(NOT EXISTS ${data}/t10k-images-idx3-ubyte.gz)
  set(skip "Fashion-MNIST is not installed at ${data}")
elseif(NOT ONNX)
  set(skip "qgrad was built without ONNX (libonnx-dev, libprotobuf-dev)")
else()
  execute_process(COMMAND ${PYTHON} -c "import numpy, onnx, onnxruntime" RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT rc EQUAL 0)
    set(skip "${PYTHON} lacks numpy, onnx or onnxruntime (scripts/setup.sh installs them in build/venv)")
  endif()
endif()
if(skip)
  message("SKIPPED: ${skip}")
  return()
endif()
file(REMOVE_RECURSE ${OUT})
execute_process(COMMAND ${EXE} --epochs 1 --qat-epochs 1 --limit-train 10000 --seed 3 --device cpu --data ${data}
                        --out ${OUT} --plot-format svg --export-onnx ${OUT}/onnx/mlp.onnx
                RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "qgrad-qat-mlp --export-onnx failed (${rc}):\n${log}")
endif()
foreach(form "int8;mlp.onnx;0.999" "qat;mlp_qat.onnx;0.995")
  list(GET form 0 name)
  list(GET form 1 file)
  list(GET form 2 min)
  execute_process(COMMAND ${PYTHON} ${SCRIPT} ${OUT}/onnx/${file} --data ${data}
                          --predictions ${OUT}/onnx/mlp_${name}_predictions.txt
                          --logits ${OUT}/onnx/mlp_${name}_logits.npy --min-agreement ${min}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE check ERROR_VARIABLE check)
  message("${name}: ${check}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "onnx_check.py on the ${name} model failed (${rc})")
  endif()
endforeach()
