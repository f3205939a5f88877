"""Linear layers: dense (dense_linear.py: dense_bf16_dot.c, amx_gemm.c, dense_fixed_order.c) and kept-quantized, three
arithmetics told apart by name: quant_bf16_dot.c (bf16 inputs times the weights' exact integers; amx_quant.c and
quant_vnni.c on the amx tier), quant_exact_f32.c (float32 inputs times the weights unpacked to their exact values)
and quant_int8_rows.c (inputs rounded to 8 bits per block, integer dot products)."""
