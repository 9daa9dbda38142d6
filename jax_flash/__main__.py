from jax_flash.benchmark import main

main()
