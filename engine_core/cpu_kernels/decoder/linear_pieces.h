/* What both decoder loops' layers hold for each linear layer (loop_avx512_bf16.py's _Linear). */
#ifndef NVLLM_LINEAR_PIECES_H
#define NVLLM_LINEAR_PIECES_H

/* A linear layer's weights: one packed weight, or the pieces of a fused layer whose GGUF file stores them in
 * different types (Q4_K_M: v_proj Q6_K beside q/k Q4_K), each multiplied by its own kernel into its columns of
 * the output, in order. `kind` says which kernel reads a piece (each loop's own codes; KIND_DOT + t: quant_int8_rows.c's
 * GGUF type t). */
#define MAX_PIECES 3
#define KIND_DOT 100
typedef struct {
    const void *w[MAX_PIECES];
    long kind[MAX_PIECES], rows[MAX_PIECES];
    long pieces;
} Linear;
#endif
